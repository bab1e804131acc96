//! [`Client`]: the async API: connect, fetch interfaces, call, call asynchronously, start a
//! transaction. It checks each call against its function's interface and encodes it; the
//! connection task (`driver.rs`) owns the socket, reconnection and results.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rtpool_proto::{Call, FunctionInfo};
use tokio::sync::oneshot;

use crate::call::{CallHandle, Outputs};
use crate::config::Config;
use crate::driver::{self, Command, Link, Submitted};
use crate::error::{ClientError, Result};
use crate::interface::Interface;
use crate::options::CallOptions;
use crate::value::{encode_args, Value};

/// Interfaces by (name, version asked for), shared by a client's clones.
pub(crate) type Cache = Arc<Mutex<HashMap<(String, Option<String>), Arc<Interface>>>>;

/// A connection to a master, for calling the functions its workers serve.
///
/// Cheap to clone (clones share the connection and the interface cache) and `Send + Sync`.
///
/// ```no_run
/// # async fn run() -> rtpool_client::Result<()> {
/// use rtpool_client::{Client, Config, NdArray};
/// let client = Client::connect(Config::new("127.0.0.1:7070")?).await?;   // token: $RTPOOL_TOKEN
/// let n = 2;
/// let a = NdArray::from_f64(&[n, n], &[1.0, 2.0, 3.0, 4.0])?;
/// let out = client.call("dmmul", vec![n.into(), a.clone().into(), a.into()]).await?;
/// assert_eq!(out[0].as_array().unwrap().to_f64().unwrap(), [7.0, 10.0, 15.0, 22.0]);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    pub(crate) link: Link,
    pub(crate) cache: Cache,
}

impl Client {
    /// Connects to the first master of `config` that answers, and authenticates.
    ///
    /// # Errors
    ///
    /// [`ClientError::Unreachable`] when no address answers, [`ClientError::Auth`] for a
    /// refused token, [`ClientError::Config`] for a missing token or an unusable CA file.
    pub async fn connect(config: Config) -> Result<Client> {
        let link = driver::start(config).await?;
        Ok(Client {
            link,
            cache: Arc::default(),
        })
    }

    /// The address of the master this client is connected to (or last was).
    pub fn address(&self) -> String {
        self.link.address()
    }

    /// The master's largest frame, in bytes (from its `WELCOME`).
    pub fn max_frame_bytes(&self) -> usize {
        self.link.max_frame_bytes()
    }

    /// Every function the master's workers serve, newest version first within a name.
    ///
    /// # Errors
    ///
    /// [`ClientError::ConnectionLost`] when the master cannot be reached.
    pub async fn functions(&self) -> Result<Vec<Interface>> {
        self.registry("")
            .await?
            .into_iter()
            .map(|f| Interface::from_blob(&f.interface, f.servers))
            .collect()
    }

    async fn registry(&self, name: &str) -> Result<Vec<FunctionInfo>> {
        let (reply, rx) = oneshot::channel();
        self.link.send(Command::Functions {
            name: name.to_owned(),
            reply,
        });
        rx.await.map_err(|_| ClientError::Closed)?
    }

    /// `name`'s interface (`version`, or the newest), fresh from the master; it also goes
    /// into the cache the calls use.
    ///
    /// # Errors
    ///
    /// [`ClientError::UnknownFunction`] when no worker serves it (the message lists what
    /// is served).
    pub async fn interface(&self, name: &str, version: Option<&str>) -> Result<Arc<Interface>> {
        let infos = self.registry(name).await?;
        let found = infos
            .iter()
            .find(|f| version.is_none_or(|v| f.version == v))
            .map(|f| Interface::from_blob(&f.interface, f.servers))
            .transpose()?;
        let Some(iface) = found else {
            let served = describe_served(&self.registry("").await?);
            let function = match version {
                None => name.to_owned(),
                Some(v) => format!("{name} version {v}"),
            };
            return Err(ClientError::UnknownFunction { function, served });
        };
        let iface = Arc::new(iface);
        let key = (name.to_owned(), version.map(str::to_owned));
        self.cache
            .lock()
            .expect("cache lock")
            .insert(key, iface.clone());
        Ok(iface)
    }

    /// The cached interface, else fetched: `(interface, from the cache)`.
    pub(crate) async fn cached(
        &self,
        name: &str,
        version: Option<&str>,
    ) -> Result<(Arc<Interface>, bool)> {
        let key = (name.to_owned(), version.map(str::to_owned));
        if let Some(iface) = self.cache.lock().expect("cache lock").get(&key) {
            return Ok((iface.clone(), true));
        }
        Ok((self.interface(name, version).await?, false))
    }

    /// Calls `name` with `args` (its `In` and `InOut` arguments in order, or every
    /// parameter, Ninf style) and waits for its outputs.
    ///
    /// # Errors
    ///
    /// [`ClientError::WrongArguments`] before anything is sent; the call's own failure
    /// ([`ClientError::Remote`], [`ClientError::TimeLimit`], ...) after.
    pub async fn call(&self, name: &str, args: Vec<Value>) -> Result<Outputs> {
        self.call_with(name, args, &CallOptions::default()).await
    }

    /// [`call`](Self::call) with options. A function whose cached interface the master no
    /// longer serves (its workers left) is looked up again and the call re-sent once.
    ///
    /// # Errors
    ///
    /// As [`call`](Self::call); [`ClientError::WaitTimeout`] past `opts.wait`.
    pub async fn call_with(
        &self,
        name: &str,
        args: Vec<Value>,
        opts: &CallOptions,
    ) -> Result<Outputs> {
        let (handle, iface, cached, call) = self.start_call(name, args, opts).await?;
        match handle.await {
            Err(ClientError::UnknownFunction { .. }) if cached => {
                // Its workers left since it was cached: look it up again and, if the
                // interface did not change, send the same arguments again once.
                self.forget(name, opts.version.as_deref());
                let fresh = self.interface(name, opts.version.as_deref()).await?;
                if fresh.params != iface.params || fresh.returns != iface.returns {
                    return Err(ClientError::WrongArguments {
                        function: name.to_owned(),
                        problem: format!("its interface changed while calling it; now: {fresh}"),
                    });
                }
                let call = Call {
                    version: fresh.version.clone(),
                    ..call
                };
                let mut handles = self.submit(vec![call], vec![true], opts).await?;
                handles.pop().expect("one call, one handle").await
            }
            outcome => outcome,
        }
    }

    /// Sends the call and returns its handle at once (a future of its outputs).
    ///
    /// # Errors
    ///
    /// [`ClientError::WrongArguments`], [`ClientError::UnknownFunction`] or
    /// [`ClientError::TooLarge`] before anything is sent.
    pub async fn call_async(
        &self,
        name: &str,
        args: Vec<Value>,
        opts: &CallOptions,
    ) -> Result<CallHandle> {
        Ok(self.start_call(name, args, opts).await?.0)
    }

    async fn start_call(
        &self,
        name: &str,
        args: Vec<Value>,
        opts: &CallOptions,
    ) -> Result<(CallHandle, Arc<Interface>, bool, Call)> {
        let (iface, cached) = self.cached(name, opts.version.as_deref()).await?;
        let values = iface.check(args, false)?;
        let call = Call {
            name: iface.name.clone(),
            version: iface.version.clone(),
            args: encode_args(&values, &[]).into(),
            deps: Vec::new(),
            fetch: true,
        };
        let mut handles = self.submit(vec![call.clone()], vec![true], opts).await?;
        Ok((
            handles.pop().expect("one call, one handle"),
            iface,
            cached,
            call,
        ))
    }

    /// Sends one `CALL` of `calls` (with `fetched[i]`: whether call `i`'s outputs come
    /// back) and returns their handles.
    pub(crate) async fn submit(
        &self,
        calls: Vec<Call>,
        fetched: Vec<bool>,
        opts: &CallOptions,
    ) -> Result<Vec<CallHandle>> {
        let wire = opts.to_wire()?;
        let names: Vec<String> = calls.iter().map(|c| c.name.clone()).collect();
        let Submitted { group, receivers } = self.link.submit(calls, wire)?;
        Ok(names
            .into_iter()
            .zip(receivers)
            .zip(fetched)
            .enumerate()
            .map(|(i, ((name, rx), fetched))| {
                CallHandle::new(
                    name,
                    self.link.clone(),
                    group,
                    i as u32,
                    fetched,
                    rx,
                    opts.wait,
                )
            })
            .collect())
    }

    fn forget(&self, name: &str, version: Option<&str>) {
        let key = (name.to_owned(), version.map(str::to_owned));
        self.cache.lock().expect("cache lock").remove(&key);
    }

    /// Closes the connection once every pending call is done (the master keeps calls still
    /// running for its `--result-ttl`, then cancels them).
    pub async fn close(&self) {
        let (done, rx) = oneshot::channel();
        self.link.send(Command::Close { done });
        let _ = rx.await;
    }
}

/// `add (2, 1), noop (1)`, as the Python client writes it, or `nothing`.
fn describe_served(infos: &[FunctionInfo]) -> String {
    let mut names: Vec<(String, Vec<String>)> = Vec::new();
    for f in infos {
        let v = if f.version.is_empty() {
            "\"\"".to_owned()
        } else {
            f.version.clone()
        };
        match names.iter_mut().find(|(n, _)| *n == f.name) {
            Some((_, vs)) => vs.push(v),
            None => names.push((f.name.clone(), vec![v])),
        }
    }
    if names.is_empty() {
        return "nothing".into();
    }
    names
        .iter()
        .map(|(n, vs)| format!("{n} ({})", vs.join(", ")))
        .collect::<Vec<_>>()
        .join(", ")
}
