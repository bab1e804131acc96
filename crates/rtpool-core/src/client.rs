//! [`Client`]: one client connection and the packages it owns.

use std::collections::HashSet;

use crate::ids::PackageId;

/// One client.
#[derive(Debug, Default)]
pub(crate) struct Client {
    /// Its live packages, so losing the client frees them without a scan of all packages.
    pub(crate) packages: HashSet<PackageId>,
}
