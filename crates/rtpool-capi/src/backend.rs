//! The one module that talks to `rtpool-client`: a connection to one master on a private
//! tokio runtime, the interface of a function as a [`Signature`], and asynchronous calls whose
//! outcome lands in the session table.
//!
//! Each call is a task on the runtime: it awaits the call's handle, writes the outputs into
//! the caller's memory and then records the outcome (`sessions.rs`), so a waiter woken by the
//! outcome finds its outputs in place. `grpc_cancel` wakes the task, which cancels the call at
//! the master and waits for the call's final outcome.

use std::sync::Arc;
use std::time::Duration;

use rtpool_client::{CallOptions, Client, Interface, Mode as ClientMode};
use tokio::runtime::Runtime;
use tokio::sync::Notify;

use crate::args::{self, Prepared};
use crate::config::Settings;
use crate::error::{CapiError, GRPC_OTHER_ERROR_CODE};
use crate::sessions::{grpc_sessionid_t, Sessions};
use crate::signature::{Kind, Mode, Param, Signature};

/// Per-handle call options (the `rtpool_handle_set_*` extensions); zero means "not set".
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HandleOptions {
    /// Priority (higher runs first); 0 is the default.
    pub priority: i32,
    /// The call's deadline, in milliseconds after it is sent; 0: none.
    pub deadline_ms: u64,
    /// The call's time limit on its worker, in milliseconds; 0: none.
    pub timeout_ms: u64,
    /// What each call holds of its worker (`gpu=1`), by name; empty: one slot only.
    pub resources: Vec<(String, u64)>,
    /// Labels its worker must have, by key.
    pub labels: Vec<(String, String)>,
}

impl HandleOptions {
    /// Sets resource `name` to `amount` (0 removes it).
    pub fn set_resource(&mut self, name: &str, amount: u64) {
        self.resources.retain(|(n, _)| n != name);
        if amount > 0 {
            self.resources.push((name.to_owned(), amount));
        }
    }

    /// Sets label `key` to `value` (`None` removes it).
    pub fn set_label(&mut self, key: &str, value: Option<&str>) {
        self.labels.retain(|(k, _)| k != key);
        if let Some(value) = value {
            self.labels.push((key.to_owned(), value.to_owned()));
        }
    }

    fn to_client(&self) -> CallOptions {
        let mut opts = CallOptions::new().priority(self.priority);
        opts.resources = self.resources.clone();
        opts.labels = self.labels.clone();
        if self.deadline_ms > 0 {
            opts = opts.deadline(Duration::from_millis(self.deadline_ms));
        }
        if self.timeout_ms > 0 {
            opts = opts.timeout(Duration::from_millis(self.timeout_ms));
        }
        opts
    }
}

/// A connection to one master.
pub struct Backend {
    rt: Runtime,
    client: Client,
}

impl Backend {
    /// Connect to the master at `addresses` with `settings`' token and TLS.
    ///
    /// # Errors
    ///
    /// `GRPC_SERVER_NOT_FOUND` (nobody answers), `GRPC_RPC_REFUSED` (a wrong token), or the
    /// configuration's error.
    pub fn connect(settings: &Settings, addresses: &str) -> Result<Backend, CapiError> {
        let config = settings.client_config(addresses)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("rtpool-capi")
            .enable_all()
            .build()
            .map_err(|e| {
                CapiError::new(
                    GRPC_OTHER_ERROR_CODE,
                    format!("cannot start the client's runtime: {e}"),
                )
            })?;
        let client = rt.block_on(Client::connect(config))?;
        Ok(Backend { rt, client })
    }

    /// The interface of `function` for C callers.
    ///
    /// # Errors
    ///
    /// `GRPC_FUNCTION_NOT_FOUND` when no worker serves it; a communication error.
    pub fn signature(&self, function: &str) -> Result<Signature, CapiError> {
        let iface = self.rt.block_on(self.client.interface(function, None))?;
        to_signature(&iface)
    }

    /// Send a prepared call; its outcome goes to `sessions` under `id` once its outputs are
    /// written.
    ///
    /// # Errors
    ///
    /// What the client refuses before sending (arguments, size, unknown function).
    pub fn start(
        &self,
        function: &str,
        prepared: Prepared,
        opts: HandleOptions,
        sessions: Arc<Sessions>,
        id: grpc_sessionid_t,
        cancel: Arc<Notify>,
    ) -> Result<(), CapiError> {
        let mut handle = self.rt.block_on(self.client.call_async(
            function,
            prepared.values,
            &opts.to_client(),
        ))?;
        let function = function.to_owned();
        let outputs = prepared.outputs;
        self.rt.spawn(async move {
            let outcome = tokio::select! {
                outcome = &mut handle => outcome,
                () = cancel.notified() => {
                    handle.cancel();
                    handle.await
                }
            };
            let result = match outcome {
                // SAFETY: the caller keeps its output buffers until it waited for the session.
                Ok(values) => unsafe { args::write(&function, &outputs, values) },
                Err(err) => Err(CapiError::from(err)),
            };
            sessions.complete(id, result);
        });
        Ok(())
    }

    /// The master's largest frame, in bytes.
    pub fn max_frame_bytes(&self) -> usize {
        self.client.max_frame_bytes()
    }

    /// Close the connection (pending calls fail).
    pub fn close(&self) {
        self.rt.block_on(self.client.close());
    }
}

/// The C view of a client interface.
///
/// # Errors
///
/// `GRPC_OTHER_ERROR_CODE` when a shape does not parse (the worker declared it, so this is
/// the worker's bug, named).
pub fn to_signature(iface: &Interface) -> Result<Signature, CapiError> {
    let kind = |p: &rtpool_client::Param| {
        Kind::from_interface(&p.type_name, p.dtype.as_deref(), p.shape.as_deref()).map_err(|e| {
            CapiError::new(
                GRPC_OTHER_ERROR_CODE,
                format!("{}: parameter {}: {e}", iface.name, p.name),
            )
        })
    };
    let params = iface
        .params
        .iter()
        .map(|p| {
            let mode = match p.mode {
                ClientMode::In => Mode::In,
                ClientMode::Out => Mode::Out,
                ClientMode::InOut => Mode::InOut,
            };
            Ok(Param {
                name: p.name.clone(),
                mode,
                kind: kind(p)?,
            })
        })
        .collect::<Result<_, CapiError>>()?;
    let returns = iface.returns.as_ref().map(kind).transpose()?;
    Ok(Signature {
        function: iface.name.clone(),
        params,
        returns,
    })
}
