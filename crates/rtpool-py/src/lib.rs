//! PyO3 glue only: the `rtpool._native` module embeds the master ([`Master`]) and runs it in the
//! foreground for `rtpool master` ([`run_master`]). Errors are raised as
//! `rtpool.errors.RtpoolError`, never as a bare exception with Debug text.

use std::path::PathBuf;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use rtpool_master::{MasterConfig, MasterError, MasterHandle};

fn to_py_err(py: Python<'_>, e: MasterError) -> PyErr {
    let msg = e.to_string();
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

#[allow(clippy::too_many_arguments)]
fn config(
    listen: String,
    client_token: Option<String>,
    worker_token: Option<String>,
    data_dir: Option<PathBuf>,
    max_frame_bytes: Option<usize>,
    heartbeat_ms: Option<u32>,
    tls: TlsAndLimits,
) -> MasterConfig {
    let d = MasterConfig::default();
    MasterConfig {
        listen,
        data_dir,
        client_token,
        worker_token,
        max_frame_bytes: max_frame_bytes.unwrap_or(d.max_frame_bytes),
        heartbeat_ms: heartbeat_ms.unwrap_or(d.heartbeat_ms),
        tls_cert: tls.tls_cert,
        tls_key: tls.tls_key,
        tls_self_signed: tls.tls_self_signed,
        max_connections: tls.max_connections.unwrap_or(d.max_connections),
        max_buffered_bytes: tls.max_buffered_bytes.unwrap_or(d.max_buffered_bytes),
        lease_ms: tls.lease_ms.unwrap_or(d.lease_ms),
        client_timeout_ms: tls.client_timeout_ms.unwrap_or(d.client_timeout_ms),
        ..d
    }
}

/// The TLS and limit parameters shared by `Master(...)` and `run_master(...)`.
struct TlsAndLimits {
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_self_signed: bool,
    max_connections: Option<usize>,
    max_buffered_bytes: Option<usize>,
    lease_ms: Option<u32>,
    client_timeout_ms: Option<u32>,
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
    #[pyo3(signature = (listen="127.0.0.1:0".to_string(), client_token=None, worker_token=None, data_dir=None, max_frame_bytes=None, heartbeat_ms=None, *, tls_cert=None, tls_key=None, tls_self_signed=false, max_connections=None, max_buffered_bytes=None, lease_ms=None, client_timeout_ms=None))]
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
    ) -> PyResult<Self> {
        let tls = TlsAndLimits {
            tls_cert,
            tls_key,
            tls_self_signed,
            max_connections,
            max_buffered_bytes,
            lease_ms,
            client_timeout_ms,
        };
        let cfg = config(
            listen,
            client_token,
            worker_token,
            data_dir,
            max_frame_bytes,
            heartbeat_ms,
            tls,
        );
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
            let c = s.core;
            d.set_item("connections", s.connections)?;
            d.set_item("tasks", c.tasks)?;
            d.set_item("packages", c.packages)?;
            d.set_item("queued", c.queued)?;
            d.set_item("running", c.running)?;
            d.set_item("workers", c.workers)?;
            d.set_item("clients", c.clients)?;
            d.set_item("functions", c.functions)?;
            d.set_item("delivered", c.delivered)?;
            d.set_item("stale_results", c.stale_results)?;
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

/// Run a master in the foreground until SIGINT/SIGTERM (the GIL is released meanwhile).
#[pyfunction]
#[pyo3(signature = (listen="127.0.0.1:7070".to_string(), data_dir=None, max_frame_bytes=None, heartbeat_ms=None, log_level="info".to_string(), *, tls_cert=None, tls_key=None, tls_self_signed=false, max_connections=None, max_buffered_bytes=None, lease_ms=None, client_timeout_ms=None))]
#[allow(clippy::too_many_arguments)]
fn run_master(
    py: Python<'_>,
    listen: String,
    data_dir: Option<PathBuf>,
    max_frame_bytes: Option<usize>,
    heartbeat_ms: Option<u32>,
    log_level: String,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_self_signed: bool,
    max_connections: Option<usize>,
    max_buffered_bytes: Option<usize>,
    lease_ms: Option<u32>,
    client_timeout_ms: Option<u32>,
) -> PyResult<()> {
    rtpool_master::init_logging(&log_level);
    let tls = TlsAndLimits {
        tls_cert,
        tls_key,
        tls_self_signed,
        max_connections,
        max_buffered_bytes,
        lease_ms,
        client_timeout_ms,
    };
    let cfg = config(
        listen,
        None,
        None,
        data_dir,
        max_frame_bytes,
        heartbeat_ms,
        tls,
    );
    py.allow_threads(|| rtpool_master::run_blocking(cfg))
        .map_err(|e| to_py_err(py, e))
}

/// The `rtpool._native` extension module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Master>()?;
    m.add_function(wrap_pyfunction!(run_master, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
