//! rtpool-core: the scheduler as a pure state machine.
//!
//! It owns the task, package, worker and function tables, the ready queue and the credits. It
//! has no I/O, no clock, no threads: time comes in as an argument ([`Instant`]), and the only way
//! in is [`Core::handle`], which turns one [`Event`] (a fact) into [`Action`]s (orders) that the
//! master shell carries out. Every operation is O(1) per task it touches, never a scan of all
//! tasks, packages or workers (the RT-BOINC rule: a predictable worst case).

mod buffers;
mod class;
mod client;
mod config;
mod core;
mod estimate;
mod event;
mod function;
mod group;
mod hungry;
mod ids;
mod kind;
mod order;
mod overload;
mod package;
mod placement;
mod queue;
mod service;
mod stats;
mod table;
mod task;
mod worker;

pub use crate::config::CoreConfig;
pub use crate::core::{ClassView, PackageView, WorkerView};
pub use crate::core::{Core, CALLS_HASH, REPORT_MARGIN_US};
pub use crate::estimate::Estimate;
pub use crate::event::{
    Action, AssignCall, AssignTask, CallSpec, Event, Labels, LossCause, MissPolicy, PackageCounts,
    PackageOpts, RejectReason, Resources, RestoredPackage, ServiceDecl, ServiceInfo, TaskOutcome,
    TaskStatus, Unschedulable, WorkerOutcome,
};
pub use crate::ids::{ClientId, FnHash, Instant, PackageId, TaskId, UserId, WorkerId, WorkerKey};
pub use crate::overload::{OverloadStatus, MIN_RESULTS as OVERLOAD_MIN_RESULTS};
pub use crate::stats::{CoreStats, Counters, ResultBytes, WorkerStats};
pub use crate::table::IdHasher;
