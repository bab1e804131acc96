//! [`Transaction`]: a dependency graph of calls sent as one `CALL` frame, as the Python
//! client's `transaction()` (`docs/rpc.md`, "Transactions"). A call's output passed to a
//! later call ([`TxCall::output`]) is a data dependency: it stays on the worker that made it
//! unless fetched, and the master starts each call once its inputs exist.

use std::sync::Arc;

use rtpool_proto::Call;

use crate::call::CallHandle;
use crate::client::Client;
use crate::error::{ClientError, Result};
use crate::interface::Interface;
use crate::options::CallOptions;
use crate::value::{encode_args, OutputRef, Value};

/// A call added to a [`Transaction`]; stands for its outputs in later calls.
#[derive(Debug, Clone)]
pub struct TxCall {
    index: u32,
    outputs: u32,
    label: String,
}

impl TxCall {
    /// The call's position in its transaction (and of its handle in
    /// [`Transaction::commit`]'s result).
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Its `i`-th output as an argument of a later call of the same transaction.
    ///
    /// # Errors
    ///
    /// [`ClientError::WrongArguments`] when the call has no output `i`.
    pub fn output(&self, i: u32) -> Result<Value> {
        if i >= self.outputs {
            return Err(ClientError::WrongArguments {
                function: self.label.clone(),
                problem: format!("has {} outputs; output {i} does not exist", self.outputs),
            });
        }
        Ok(Value::Output(OutputRef {
            call: self.index,
            output: i,
        }))
    }

    /// Its only output as an argument of a later call.
    ///
    /// # Errors
    ///
    /// [`ClientError::WrongArguments`] when the call has no output or several (pass
    /// [`output(i)`](Self::output)).
    pub fn value(&self) -> Result<Value> {
        if self.outputs != 1 {
            return Err(ClientError::WrongArguments {
                function: self.label.clone(),
                problem: format!("has {} outputs: pass one of them, output(i)", self.outputs),
            });
        }
        self.output(0)
    }
}

impl Client {
    /// A transaction: calls that may take each other's outputs, sent as one frame by
    /// [`Transaction::commit`].
    pub fn transaction(&self) -> Transaction {
        Transaction::new(self.clone())
    }
}

struct Entry {
    iface: Arc<Interface>,
    values: Vec<Value>,
    deps: Vec<u32>,
    fetch: bool,
}

/// Calls that take each other's outputs, checked as they are added and sent as one frame by
/// [`commit`](Self::commit).
///
/// ```no_run
/// # async fn run(client: rtpool_client::Client, n: usize, a: rtpool_client::NdArray,
/// #              b: rtpool_client::NdArray) -> rtpool_client::Result<()> {
/// let mut tx = client.transaction();
/// let f = tx.call("dgefa", vec![n.into(), a.into()]).await?;          // -> (info, LU, ipvt)
/// let x = tx.call("dgesl", vec![n.into(), f.output(1)?, f.output(2)?, b.into()]).await?;
/// let handles = tx.commit(&Default::default()).await?;               // one CALL frame
/// let solution = rtpool_client::wait_all(handles).await.pop().unwrap()?;
/// # Ok(()) }
/// ```
pub struct Transaction {
    client: Client,
    calls: Vec<Entry>,
}

impl Transaction {
    pub(crate) fn new(client: Client) -> Transaction {
        Transaction {
            client,
            calls: Vec::new(),
        }
    }

    /// Adds a call of `name` (its newest version); [`Value::Output`] arguments (from
    /// [`TxCall::output`]) are its dependencies.
    ///
    /// # Errors
    ///
    /// [`ClientError::WrongArguments`] (an argument does not fit the interface, or names a
    /// call not in this transaction), [`ClientError::UnknownFunction`].
    pub async fn call(&mut self, name: &str, args: Vec<Value>) -> Result<TxCall> {
        self.call_version(name, None, args).await
    }

    /// [`call`](Self::call) of a given version.
    ///
    /// # Errors
    ///
    /// As [`call`](Self::call).
    pub async fn call_version(
        &mut self,
        name: &str,
        version: Option<&str>,
        args: Vec<Value>,
    ) -> Result<TxCall> {
        let (iface, _) = self.client.cached(name, version).await?;
        let index = self.calls.len() as u32;
        let label = format!("call #{index} {name}");
        let values = iface.check(args, true)?;
        let mut deps = Vec::new();
        for v in &values {
            if let Value::Output(r) = v {
                if r.call >= index {
                    return Err(ClientError::WrongArguments {
                        function: label,
                        problem: format!("takes the output of call #{}, which is not an earlier call of this transaction", r.call),
                    });
                }
                if !deps.contains(&r.call) {
                    deps.push(r.call);
                }
            }
        }
        let outputs = iface.outputs().count() as u32;
        self.calls.push(Entry {
            iface,
            values,
            deps,
            fetch: false,
        });
        Ok(TxCall {
            index,
            outputs,
            label,
        })
    }

    /// Brings `call`'s outputs to the client even though later calls take them.
    pub fn fetch(&mut self, call: &TxCall) {
        if let Some(e) = self.calls.get_mut(call.index as usize) {
            e.fetch = true;
        }
    }

    /// Sends every call in one `CALL` frame; the handles in call order. A call no other call
    /// depends on is always fetched; an intermediate not fetched resolves to
    /// [`ClientError::NotFetched`] once it succeeded.
    ///
    /// # Errors
    ///
    /// [`ClientError::TooLarge`] (nothing sent) or [`ClientError::WrongArguments`] for an
    /// empty transaction.
    pub async fn commit(self, opts: &CallOptions) -> Result<Vec<CallHandle>> {
        if self.calls.is_empty() {
            return Err(ClientError::WrongArguments {
                function: "transaction".into(),
                problem: "has no calls".into(),
            });
        }
        let n = self.calls.len();
        let mut has_dependents = vec![false; n];
        for e in &self.calls {
            for &d in &e.deps {
                has_dependents[d as usize] = true;
            }
        }
        let fetched: Vec<bool> = self
            .calls
            .iter()
            .zip(&has_dependents)
            .map(|(e, &dep)| e.fetch || !dep)
            .collect();
        let calls = self
            .calls
            .iter()
            .zip(&fetched)
            .map(|(e, &fetch)| Call {
                name: e.iface.name.clone(),
                version: e.iface.version.clone(),
                args: encode_args(&e.values, &e.deps).into(),
                deps: e.deps.clone(),
                fetch,
            })
            .collect();
        self.client.submit(calls, fetched, opts).await
    }
}
