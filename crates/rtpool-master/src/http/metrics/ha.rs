//! The high-availability gauges (`--ha`): `rtpool_ha_role`, `rtpool_ha_epoch`.

use prometheus_client::encoding::DescriptorEncoder;

use super::{gauge, one, Labels};
use crate::status::Status;

/// High availability: the role (one series per role, 1 for this master's) and the epoch.
pub(super) fn ha(e: &mut DescriptorEncoder, s: &Status) -> Result<(), std::fmt::Error> {
    let Some(ha) = &s.ha else {
        return Ok(());
    };
    let roles = ["leader", "standby"].map(|role| {
        let labels: Labels = vec![("role", role.to_string())];
        (labels, f64::from(u8::from(ha.role == role)))
    });
    gauge(
        e,
        "rtpool_ha_role",
        "This master's high-availability role: 1 for the role it has, 0 for the other.",
        None,
        roles,
    )?;
    gauge(
        e,
        "rtpool_ha_epoch",
        "The leader lease's epoch: this master's while it leads, else the last one seen.",
        None,
        one(ha.epoch as f64),
    )
}
