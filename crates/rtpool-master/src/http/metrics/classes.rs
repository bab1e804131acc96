//! Series of worker resources and resource classes: what each worker has and holds, and the
//! tasks queued per class (what they ask of their workers).

use prometheus_client::encoding::DescriptorEncoder;

use super::{gauge, worker_labels, Labels};
use crate::status::Status;

pub(super) fn classes(e: &mut DescriptorEncoder, s: &Status) -> Result<(), std::fmt::Error> {
    let workers = worker_labels(s);
    let per_resource = |in_use: bool| {
        let mut series: Vec<(Labels, f64)> = Vec::new();
        for (labels, w) in workers.iter().zip(&s.workers) {
            for (name, total) in &w.resources {
                let value = if in_use {
                    w.in_use.get(name).copied().unwrap_or(0)
                } else {
                    *total
                };
                let mut l = labels.clone();
                l.push(("resource", name.clone()));
                series.push((l, value as f64));
            }
        }
        series
    };
    gauge(
        e,
        "rtpool_worker_resource_capacity",
        "What a worker has for tasks that ask for resources, by worker and resource.",
        None,
        per_resource(false),
    )?;
    gauge(
        e,
        "rtpool_worker_resource_in_use",
        "How much of a resource a worker's running tasks hold.",
        None,
        per_resource(true),
    )?;
    let per_class = |f: fn(&crate::status::schema::ResourceClassStatus) -> f64| {
        s.resource_classes
            .iter()
            .map(|c| (vec![("class", c.name.clone())], f(c)))
            .collect::<Vec<_>>()
    };
    gauge(
        e,
        "rtpool_class_queued",
        "Tasks waiting for a worker, by resource class (what they ask of it).",
        None,
        per_class(|c| c.queued as f64),
    )?;
    gauge(
        e,
        "rtpool_class_running",
        "Tasks running, by resource class.",
        None,
        per_class(|c| c.running as f64),
    )?;
    gauge(
        e,
        "rtpool_class_unschedulable",
        "1 while no connected worker can serve a resource class (its tasks wait).",
        None,
        per_class(|c| f64::from(u8::from(c.unschedulable))),
    )
}
