//! PyO3 glue only: the `rtpool._native` module embeds the master ([`Master`]), runs the
//! master's command line for `rtpool master` ([`master_main`], the one the `rtpool-master`
//! binary runs) and manages users, tokens and quotas for `rtpool token` (`token_*`, over
//! [`rtpool_master::store`]) and simulates workers for `rtpool bench scale` ([`sim`]). Errors are raised as `rtpool.errors.RtpoolError`, never as a bare
//! exception with Debug text.

mod sim;

use std::path::PathBuf;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyList, PyTuple};
use rtpool_master::config::options::{apply_options, OptionValue};
use rtpool_master::realtime::{parse_cpus, ProcessMemoryLock, RealtimeConfig, RealtimeReport};
use rtpool_master::store::{self, Store, StoreError, TokenInfo, UserQuota};
use rtpool_master::{MasterConfig, MasterError, MasterHandle, MasterStats};
use rtpool_proto::Role;

fn to_py_err(py: Python<'_>, e: MasterError) -> PyErr {
    rtpool_error(py, e.to_string())
}

/// `rtpool.errors.RtpoolError(msg)`, or a `RuntimeError` if that class cannot be imported.
fn rtpool_error(py: Python<'_>, msg: String) -> PyErr {
    match py
        .import("rtpool.errors")
        .and_then(|m| m.getattr("RtpoolError"))
    {
        Ok(cls) => match cls.call1((msg.clone(),)) {
            Ok(inst) => PyErr::from_value(inst),
            Err(err) => err,
        },
        Err(_) => PyRuntimeError::new_err(msg),
    }
}

/// The real-time keywords of `Master(...)`: `cpus` is a list of ints or a
/// string as `--cpus` takes it (`"0,1"`, `"0-3"`).
fn realtime_config(
    py: Python<'_>,
    realtime: bool,
    rt_priority: u8,
    cpus: Option<&Bound<'_, PyAny>>,
) -> PyResult<RealtimeConfig> {
    let cpus = match cpus {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(match v.extract::<String>() {
            Ok(text) => parse_cpus(&text).map_err(|e| to_py_err(py, e))?,
            Err(_) => {
                let mut list: Vec<usize> = v.extract()?;
                list.sort_unstable();
                list.dedup();
                list
            }
        }),
    };
    Ok(RealtimeConfig {
        enabled: realtime,
        priority: rt_priority,
        cpus,
    })
}

/// `MasterStats::realtime` as a dict.
fn realtime_dict<'py>(py: Python<'py>, r: &RealtimeReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("active", r.is_fully_active())?;
    d.set_item("memory_locked", r.memory_locked)?;
    d.set_item("priority", r.priority)?;
    d.set_item("fifo_threads", r.fifo_threads)?;
    d.set_item("cpus", r.cpus.clone())?;
    d.set_item("pinned_threads", r.pinned_threads)?;
    d.set_item("warnings", r.warnings.clone())?;
    Ok(d)
}

/// Applies the options dict of `Master(options=...)`: any `rtpool master` option by its field
/// name ([`rtpool_master::MasterArgs`]), checked by the same parser; `None` values are
/// skipped. An unknown key or a refused value is a `ValueError` naming the known keys or the
/// reason.
fn apply_options_dict(cfg: &mut MasterConfig, options: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
    let Some(options) = options else {
        return Ok(());
    };
    let mut given = Vec::with_capacity(options.len());
    for (k, v) in options.iter() {
        let key: String = k.extract()?;
        if v.is_none() {
            continue;
        }
        given.push((key, option_value(&v)?));
    }
    apply_options(cfg, given).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// A dict value as the command line would take it: a bool for a flag, a list as `0,1`, else
/// its `str()`.
fn option_value(v: &Bound<'_, PyAny>) -> PyResult<OptionValue> {
    if v.is_instance_of::<PyBool>() {
        return Ok(OptionValue::Flag(v.extract()?));
    }
    if v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>() {
        let items: Vec<String> = v
            .try_iter()?
            .map(|item| item.and_then(|i| i.str()).map(|s| s.to_string()))
            .collect::<PyResult<_>>()?;
        return Ok(OptionValue::Text(items.join(",")));
    }
    Ok(OptionValue::Text(v.str()?.to_string()))
}

/// The core's gauges and counters of `s` into `d`, under their field names.
fn set_core_stats(d: &Bound<'_, PyDict>, s: &MasterStats) -> PyResult<()> {
    for (name, value) in s.core.iter() {
        d.set_item(name, value)?;
    }
    Ok(())
}

/// An rtpool master running in background threads of this process.
#[pyclass(module = "rtpool._native")]
struct Master {
    inner: MasterHandle,
    stopped: bool,
}

#[pymethods]
impl Master {
    #[new]
    #[pyo3(signature = (listen="127.0.0.1:0".to_string(), client_token=None, worker_token=None, data_dir=None, max_frame_bytes=None, heartbeat_ms=None, *, tls_cert=None, tls_key=None, tls_self_signed=false, max_connections=None, max_buffered_bytes=None, lease_ms=None, client_timeout_ms=None, options=None, realtime=false, rt_priority=rtpool_master::realtime::DEFAULT_PRIORITY, cpus=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        listen: String,
        client_token: Option<String>,
        worker_token: Option<String>,
        data_dir: Option<PathBuf>,
        max_frame_bytes: Option<usize>,
        heartbeat_ms: Option<u32>,
        tls_cert: Option<PathBuf>,
        tls_key: Option<PathBuf>,
        tls_self_signed: bool,
        max_connections: Option<usize>,
        max_buffered_bytes: Option<usize>,
        lease_ms: Option<u32>,
        client_timeout_ms: Option<u32>,
        options: Option<Bound<'_, PyDict>>,
        realtime: bool,
        rt_priority: u8,
        cpus: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let d = MasterConfig::default();
        let mut cfg = MasterConfig {
            listen,
            data_dir,
            client_token,
            worker_token,
            max_frame_bytes: max_frame_bytes.unwrap_or(d.max_frame_bytes),
            heartbeat_ms: heartbeat_ms.unwrap_or(d.heartbeat_ms),
            tls_cert,
            tls_key,
            tls_self_signed,
            max_connections: max_connections.unwrap_or(d.max_connections),
            max_buffered_bytes: max_buffered_bytes.or(d.max_buffered_bytes),
            lease_ms: lease_ms.unwrap_or(d.lease_ms),
            client_timeout_ms: client_timeout_ms.unwrap_or(d.client_timeout_ms),
            realtime: realtime_config(py, realtime, rt_priority, cpus.as_ref())?,
            ..d
        };
        apply_options_dict(&mut cfg, options.as_ref())?;
        let inner = py
            .allow_threads(|| MasterHandle::start(cfg))
            .map_err(|e| to_py_err(py, e))?;
        Ok(Self {
            inner,
            stopped: false,
        })
    }

    /// `host:port` the master listens on.
    #[getter]
    fn address(&self) -> String {
        self.inner.addr().to_string()
    }

    /// The certificate the master serves TLS with (a self-signed master's is the clients' CA
    /// file), or `None` without TLS.
    #[getter]
    fn tls_cert(&self) -> Option<PathBuf> {
        self.inner.tls_cert().map(PathBuf::from)
    }

    /// The dashboard's URL (``http://HOST:PORT/``; ``https://`` with TLS), or ``None`` when
    /// the master has no HTTP listener (``options={"http": "127.0.0.1:0"}`` starts one).
    #[getter]
    fn dashboard_url(&self) -> Option<String> {
        self.inner.dashboard_url()
    }

    /// Token clients must present.
    #[getter]
    fn client_token(&self) -> String {
        self.inner.tokens().client.clone()
    }

    /// Token workers must present.
    #[getter]
    fn worker_token(&self) -> String {
        self.inner.tokens().worker.clone()
    }

    /// Gauges and counters as a dict (empty once stopped).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        if self.stopped {
            return Ok(d);
        }
        if let Some(s) = py.allow_threads(|| self.inner.stats()) {
            d.set_item("connections", s.connections)?;
            set_core_stats(&d, &s)?;
            if let Some(j) = s.journal {
                d.set_item("journal_records", j.records)?;
                d.set_item("journal_bytes", j.file_bytes)?;
                d.set_item("journal_fsyncs", j.fsyncs)?;
                d.set_item("journal_compactions", j.compactions)?;
            }
            if let Some(r) = s.replay {
                d.set_item("replay_records", r.records)?;
                d.set_item("replay_us", r.elapsed_us)?;
                d.set_item("replay_packages", r.packages)?;
            }
            if let Some(r) = &s.realtime {
                d.set_item("realtime", realtime_dict(py, r)?)?;
            }
        }
        Ok(d)
    }

    /// Stop serving and close every connection. Idempotent.
    fn stop(&mut self, py: Python<'_>) {
        let inner = &mut self.inner;
        py.allow_threads(|| inner.stop());
        self.stopped = true;
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __exit__(&mut self, py: Python<'_>, _t: PyObject, _v: PyObject, _tb: PyObject) {
        self.stop(py);
    }

    fn __repr__(&self) -> String {
        format!(
            "<rtpool._native.Master {}{}>",
            self.inner.addr(),
            if self.stopped { " stopped" } else { "" }
        )
    }
}

/// This process's memory locked (`mlockall`) until [`MemoryLock::release`], counted with the
/// locks of the real-time masters embedded in this process (the memory is unlocked when the
/// last holder lets go). Held by a real-time client (`rtpool.Client(realtime=True)`).
#[pyclass(module = "rtpool._native")]
struct MemoryLock {
    inner: Option<ProcessMemoryLock>,
}

#[pymethods]
impl MemoryLock {
    /// Let go of this hold (the memory stays locked while another holder remains).
    /// Idempotent.
    fn release(&mut self) {
        self.inner = None;
    }

    /// Whether this hold is still held.
    #[getter]
    fn held(&self) -> bool {
        self.inner.is_some()
    }
}

/// Lock this process's memory (or count one more holder); returns the hold.
///
/// Raises `rtpool.errors.RtpoolError` with the warning to show (what failed, the errno, how to
/// permit it) when the OS refuses.
#[pyfunction]
fn lock_memory(py: Python<'_>) -> PyResult<MemoryLock> {
    ProcessMemoryLock::acquire("this client process's")
        .map(|lock| MemoryLock { inner: Some(lock) })
        .map_err(|why| rtpool_error(py, why))
}

/// `rtpool master ARGS...`: parse `argv` (without the program name) as the master's command
/// line, run the master in the foreground until SIGINT/SIGTERM with the GIL released, and return
/// the exit code (see [`rtpool_master::cli::main`]: 0, 1 when it cannot start, 2 for a bad
/// command line, whose message clap prints).
#[pyfunction]
fn master_main(py: Python<'_>, argv: Vec<String>) -> i32 {
    py.allow_threads(|| rtpool_master::cli::main("rtpool master", argv))
}

fn store_err(py: Python<'_>, e: StoreError) -> PyErr {
    rtpool_error(py, e.to_string())
}

/// Open the store, run `f` on it with the GIL released, and turn its error into `RtpoolError`.
fn with_store<T: Send>(
    py: Python<'_>,
    data_dir: PathBuf,
    store_url: Option<String>,
    f: impl FnOnce(&mut dyn Store) -> Result<T, StoreError> + Send,
) -> PyResult<T> {
    py.allow_threads(|| {
        let mut s = store::open(store_url.as_deref(), &data_dir)?;
        f(s.as_mut())
    })
    .map_err(|e| store_err(py, e))
}

fn parse_role(py: Python<'_>, role: &str) -> PyResult<Role> {
    Role::from_wire(role.as_bytes()).ok_or_else(|| {
        rtpool_error(
            py,
            format!("invalid role {role:?}: use \"client\" or \"worker\""),
        )
    })
}

fn token_dict<'py>(py: Python<'py>, t: &TokenInfo) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("id", &t.id)?;
    d.set_item("user", &t.user)?;
    d.set_item("role", t.role.as_str())?;
    d.set_item("created_unix", t.created_unix)?;
    d.set_item("revoked", t.revoked)?;
    Ok(d)
}

fn quota_dict<'py>(py: Python<'py>, q: &UserQuota) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("user", &q.user)?;
    d.set_item("quota_us", q.quota_us)?;
    d.set_item("used_us", q.used_us)?;
    d.set_item("max_priority", q.max_priority)?;
    Ok(d)
}

/// Create a token; returns `(token, info)`. The token is not stored and cannot be shown again.
#[pyfunction]
#[pyo3(signature = (data_dir, user, role, quota_seconds=None, store=None, max_priority=None))]
fn token_create<'py>(
    py: Python<'py>,
    data_dir: PathBuf,
    user: String,
    role: &str,
    quota_seconds: Option<f64>,
    store: Option<String>,
    max_priority: Option<i32>,
) -> PyResult<(String, Bound<'py, PyDict>)> {
    let role = parse_role(py, role)?;
    let (token, info) = with_store(py, data_dir, store, |s| {
        let created = s.create_token(&user, role, quota_seconds)?;
        if max_priority.is_some() {
            s.set_max_priority(&user, max_priority)?;
        }
        Ok(created)
    })?;
    Ok((token, token_dict(py, &info)?))
}

/// Every token (without the secrets), oldest first.
#[pyfunction]
#[pyo3(signature = (data_dir, store=None))]
fn token_list<'py>(
    py: Python<'py>,
    data_dir: PathBuf,
    store: Option<String>,
) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let tokens = with_store(py, data_dir, store, |s| s.list_tokens())?;
    tokens.iter().map(|t| token_dict(py, t)).collect()
}

/// Revoke a token by id or unique id prefix (at least 6 hex chars); returns its info.
#[pyfunction]
#[pyo3(signature = (data_dir, id, store=None))]
fn token_revoke<'py>(
    py: Python<'py>,
    data_dir: PathBuf,
    id: String,
    store: Option<String>,
) -> PyResult<Bound<'py, PyDict>> {
    let info = with_store(py, data_dir, store, |s| s.revoke(&id))?;
    token_dict(py, &info)
}

/// Set a user's quota in seconds of execution time; `None` means unlimited.
#[pyfunction]
#[pyo3(signature = (data_dir, user, quota_seconds, store=None))]
fn token_set_quota(
    py: Python<'_>,
    data_dir: PathBuf,
    user: String,
    quota_seconds: Option<f64>,
    store: Option<String>,
) -> PyResult<()> {
    with_store(py, data_dir, store, |s| s.set_quota(&user, quota_seconds))
}

/// Set a user's priority ceiling; `None` removes it.
#[pyfunction]
#[pyo3(signature = (data_dir, user, max_priority, store=None))]
fn token_set_max_priority(
    py: Python<'_>,
    data_dir: PathBuf,
    user: String,
    max_priority: Option<i32>,
    store: Option<String>,
) -> PyResult<()> {
    with_store(py, data_dir, store, |s| {
        s.set_max_priority(&user, max_priority)
    })
}

/// Every user's quota and usage, in microseconds.
#[pyfunction]
#[pyo3(signature = (data_dir, store=None))]
fn token_quotas<'py>(
    py: Python<'py>,
    data_dir: PathBuf,
    store: Option<String>,
) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let quotas = with_store(py, data_dir, store, |s| s.quotas())?;
    quotas.iter().map(|q| quota_dict(py, q)).collect()
}

/// The `rtpool._native` extension module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Master>()?;
    m.add_function(wrap_pyfunction!(master_main, m)?)?;
    m.add_class::<MemoryLock>()?;
    m.add_function(wrap_pyfunction!(lock_memory, m)?)?;
    m.add(
        "MASTER_OPTIONS",
        rtpool_master::config::options::option_keys(),
    )?;
    m.add("PACKAGE_OPTION_KEYS", rtpool_proto::OPTION_KEYS.to_vec())?;
    m.add_function(wrap_pyfunction!(token_create, m)?)?;
    m.add_function(wrap_pyfunction!(token_list, m)?)?;
    m.add_function(wrap_pyfunction!(token_revoke, m)?)?;
    m.add_function(wrap_pyfunction!(token_set_quota, m)?)?;
    m.add_function(wrap_pyfunction!(token_quotas, m)?)?;
    m.add_function(wrap_pyfunction!(token_set_max_priority, m)?)?;
    m.add_class::<sim::ScaleSim>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
