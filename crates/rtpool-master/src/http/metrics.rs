//! Prometheus text rendering of a [`Status`] snapshot (placeholder, filled in next).

use crate::status::Status;

/// The content type of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The snapshot in Prometheus text format.
pub fn render(status: &Status) -> String {
    format!(
        "rtpool_tasks_queued {}\n",
        status.totals.get("queued").copied().unwrap_or(0)
    )
}
