//! [`PackageCounts`]: a package's counters, as the core keeps them and `STATUS_REPLY` carries
//! them, defined once: the macro makes the struct, its [`PackageCounts::iter`] (the encoder's
//! field order) and its reading from a frame.

use crate::error::ProtoError;
use crate::msgpack::Reader;

/// Defines [`PackageCounts`] from one list of documented `u32` counters, in wire order.
macro_rules! package_counts {
    ($( $(#[doc = $doc:literal])* $name:ident, )*) => {
        /// Counters of a package (`STATUS_REPLY`'s fields after `package`, in this order).
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct PackageCounts {
            $( $(#[doc = $doc])* pub $name: u32, )*
        }

        impl PackageCounts {
            /// Number of counters: `STATUS_REPLY` has three fields more (`req_id`, `package`
            /// before them, `workers` after).
            pub const LEN: usize = [$( stringify!($name) ),*].len();

            /// Every counter as `(name, value)`, in wire order.
            pub fn iter(&self) -> impl Iterator<Item = (&'static str, u32)> {
                [$( (stringify!($name), self.$name) ),*].into_iter()
            }

            /// Reads the counters of a `STATUS_REPLY`, in wire order.
            pub(crate) fn read(r: &mut Reader) -> Result<Self, ProtoError> {
                Ok(Self {
                    $( $name: r.u32(concat!("STATUS_REPLY.", stringify!($name)))?, )*
                })
            }
        }
    };
}

package_counts! {
    /// Tasks in the package.
    total,
    /// Waiting for a worker.
    queued,
    /// Assigned to a worker.
    running,
    /// Finished: a result exists (sent, or waiting for the client to attach).
    done,
    /// Cancelled.
    cancelled,
    /// Results that came by the package's deadline (0 without a deadline).
    met,
    /// Results that came after the deadline, and tasks dropped for it (status 7).
    missed,
}
