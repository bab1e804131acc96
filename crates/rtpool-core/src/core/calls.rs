//! Named functions (grid RPC): the registry of who serves what, call packages, their data
//! dependencies, and placement of calls on the workers that serve them.

use crate::event::{Action, CallSpec, PackageOpts, RejectReason, ServiceDecl};
use crate::ids::{ClientId, Instant, PackageId, WorkerId};

use super::Core;

impl Core {
    /// Registers the functions a worker serves.
    pub(super) fn on_serve(
        &mut self,
        _worker: WorkerId,
        _functions: Vec<ServiceDecl>,
        _now: Instant,
        _out: &mut Vec<Action>,
    ) {
    }

    /// Creates a package of calls.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_submit_calls(
        &mut self,
        client: ClientId,
        req_id: u64,
        _package: PackageId,
        _opts: PackageOpts,
        _calls: Vec<CallSpec>,
        _now: Instant,
        out: &mut Vec<Action>,
    ) {
        out.push(Action::Rejected {
            client,
            req_id,
            reason: RejectReason::UnknownFunction {
                what: "anything".into(),
                served: "nothing".into(),
            },
        });
    }

    /// Answers a registry request.
    pub(super) fn on_functions(
        &mut self,
        client: ClientId,
        req_id: u64,
        _name: &str,
        out: &mut Vec<Action>,
    ) {
        out.push(Action::FunctionsReply {
            client,
            req_id,
            functions: Vec::new(),
        });
    }
}
