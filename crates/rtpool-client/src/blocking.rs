//! A blocking client for programs without an async runtime (and for the C library): the
//! async [`crate::Client`] on a private tokio runtime of one thread, each method waiting for
//! its answer. `Send + Sync`: one client may be used from several threads at once.
//!
//! Do not call it from inside a tokio runtime (blocking there panics, as
//! `Runtime::block_on` does); use the async client there.

use std::sync::Arc;

use tokio::runtime::Runtime;

use crate::call::Outputs;
use crate::config::Config;
use crate::error::{ClientError, Result};
use crate::interface::Interface;
use crate::options::CallOptions;
use crate::transaction::TxCall;
use crate::value::Value;

/// A blocking connection to a master.
///
/// ```no_run
/// use rtpool_client::{blocking, Config, NdArray};
/// let client = blocking::Client::connect(Config::new("127.0.0.1:7070")?)?;
/// let a = NdArray::from_f64(&[2, 2], &[1.0, 2.0, 3.0, 4.0])?;
/// let out = client.call("dmmul", vec![2i64.into(), a.clone().into(), a.into()])?;
/// println!("{:?}", out[0].as_array().unwrap().to_f64());
/// # Ok::<(), rtpool_client::ClientError>(())
/// ```
#[derive(Clone)]
pub struct Client {
    rt: Arc<Runtime>,
    inner: crate::Client,
}

/// A call in flight from a [`Client`].
pub struct CallHandle {
    rt: Arc<Runtime>,
    inner: crate::CallHandle,
}

impl Client {
    /// Connects (see [`crate::Client::connect`]).
    ///
    /// # Errors
    ///
    /// As [`crate::Client::connect`]; [`ClientError::Config`] when no runtime can start.
    pub fn connect(config: Config) -> Result<Client> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("rtpool-client")
            .enable_all()
            .build()
            .map_err(|e| ClientError::Config(format!("cannot start the client's runtime: {e}")))?;
        let inner = rt.block_on(crate::Client::connect(config))?;
        Ok(Client {
            rt: Arc::new(rt),
            inner,
        })
    }

    /// The async client underneath.
    pub fn as_async(&self) -> &crate::Client {
        &self.inner
    }

    /// The master's address.
    pub fn address(&self) -> String {
        self.inner.address()
    }

    /// The master's largest frame, in bytes.
    pub fn max_frame_bytes(&self) -> usize {
        self.inner.max_frame_bytes()
    }

    /// See [`crate::Client::functions`].
    ///
    /// # Errors
    ///
    /// As there.
    pub fn functions(&self) -> Result<Vec<Interface>> {
        self.rt.block_on(self.inner.functions())
    }

    /// See [`crate::Client::interface`].
    ///
    /// # Errors
    ///
    /// As there.
    pub fn interface(&self, name: &str, version: Option<&str>) -> Result<Arc<Interface>> {
        self.rt.block_on(self.inner.interface(name, version))
    }

    /// See [`crate::Client::call`].
    ///
    /// # Errors
    ///
    /// As there.
    pub fn call(&self, name: &str, args: Vec<Value>) -> Result<Outputs> {
        self.rt.block_on(self.inner.call(name, args))
    }

    /// See [`crate::Client::call_with`].
    ///
    /// # Errors
    ///
    /// As there.
    pub fn call_with(&self, name: &str, args: Vec<Value>, opts: &CallOptions) -> Result<Outputs> {
        self.rt.block_on(self.inner.call_with(name, args, opts))
    }

    /// See [`crate::Client::call_async`].
    ///
    /// # Errors
    ///
    /// As there.
    pub fn call_async(
        &self,
        name: &str,
        args: Vec<Value>,
        opts: &CallOptions,
    ) -> Result<CallHandle> {
        let inner = self.rt.block_on(self.inner.call_async(name, args, opts))?;
        Ok(CallHandle {
            rt: self.rt.clone(),
            inner,
        })
    }

    /// A transaction (see [`crate::Transaction`]).
    pub fn transaction(&self) -> Transaction {
        Transaction {
            rt: self.rt.clone(),
            inner: self.inner.transaction(),
        }
    }

    /// See [`crate::Client::close`].
    pub fn close(&self) {
        self.rt.block_on(self.inner.close());
    }
}

impl CallHandle {
    /// Waits for the outputs.
    ///
    /// # Errors
    ///
    /// The call's failure.
    pub fn wait(self) -> Result<Outputs> {
        let CallHandle { rt, inner } = self;
        rt.block_on(inner)
    }

    /// See [`crate::CallHandle::try_result`].
    pub fn try_result(&mut self) -> Option<Result<Outputs>> {
        self.inner.try_result()
    }

    /// See [`crate::CallHandle::is_done`].
    pub fn is_done(&self) -> bool {
        self.inner.is_done()
    }

    /// See [`crate::CallHandle::cancel`].
    pub fn cancel(&self) {
        self.inner.cancel();
    }

    /// The function called.
    pub fn function(&self) -> &str {
        self.inner.function()
    }
}

/// Waits for the first unfinished handle (see [`crate::wait_any`]); `None` if all are done.
pub fn wait_any(handles: &mut [CallHandle]) -> Option<(usize, Result<Outputs>)> {
    let rt = handles.first()?.rt.clone();
    let mut inner: Vec<&mut crate::CallHandle> = handles.iter_mut().map(|h| &mut h.inner).collect();
    rt.block_on(crate::call::wait_any_of(&mut inner))
}

/// Waits for every handle; outcomes in order (see [`crate::wait_all`]).
pub fn wait_all(handles: Vec<CallHandle>) -> Vec<Result<Outputs>> {
    handles.into_iter().map(CallHandle::wait).collect()
}

/// A blocking [`crate::Transaction`].
pub struct Transaction {
    rt: Arc<Runtime>,
    inner: crate::Transaction,
}

impl Transaction {
    /// See [`crate::Transaction::call`].
    ///
    /// # Errors
    ///
    /// As there.
    pub fn call(&mut self, name: &str, args: Vec<Value>) -> Result<TxCall> {
        self.rt.block_on(self.inner.call(name, args))
    }

    /// See [`crate::Transaction::fetch`].
    pub fn fetch(&mut self, call: &TxCall) {
        self.inner.fetch(call);
    }

    /// See [`crate::Transaction::commit`].
    ///
    /// # Errors
    ///
    /// As there.
    pub fn commit(self, opts: &CallOptions) -> Result<Vec<CallHandle>> {
        let Transaction { rt, inner } = self;
        let handles = rt.block_on(inner.commit(opts))?;
        Ok(handles
            .into_iter()
            .map(|inner| CallHandle {
                rt: rt.clone(),
                inner,
            })
            .collect())
    }
}
