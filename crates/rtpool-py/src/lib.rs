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
) -> MasterConfig {
    let d = MasterConfig::default();
    MasterConfig {
        listen,
        data_dir,
        client_token,
        worker_token,
        max_frame_bytes: max_frame_bytes.unwrap_or(d.max_frame_bytes),
        heartbeat_ms: heartbeat_ms.unwrap_or(d.heartbeat_ms),
        ..d
    }
}

/// Applies the reliability options given as a dict (`lease_ms`, `store`, `result_ttl_s`,
/// `max_attempts`, `max_task_seconds`, `timeout_grace_s`, `journal`, `fsync`); an unknown key is
/// an error naming the known ones.
fn apply_options(cfg: &mut MasterConfig, options: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
    use std::time::Duration;
    let Some(options) = options else {
        return Ok(());
    };
    let secs = |v: &Bound<'_, PyAny>, key: &str| -> PyResult<Duration> {
        let x: f64 = v.extract()?;
        Duration::try_from_secs_f64(x).map_err(|_| {
            pyo3::exceptions::PyValueError::new_err(format!("{key} must be >= 0 seconds, not {x}"))
        })
    };
    for (k, v) in options.iter() {
        let key: String = k.extract()?;
        if v.is_none() {
            continue;
        }
        match key.as_str() {
            "lease_ms" => cfg.lease_ms = v.extract()?,
            "store" => cfg.store = Some(v.extract()?),
            "result_ttl_s" => cfg.result_ttl = secs(&v, &key)?,
            "max_attempts" => cfg.max_attempts = v.extract()?,
            "max_task_seconds" => cfg.max_task_time = secs(&v, &key)?,
            "timeout_grace_s" => cfg.timeout_grace = secs(&v, &key)?,
            other => {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "unknown master option {other:?}; known: lease_ms, store, result_ttl_s, \
                     max_attempts, max_task_seconds, timeout_grace_s"
                )))
            }
        }
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
    #[pyo3(signature = (listen="127.0.0.1:0".to_string(), client_token=None, worker_token=None, data_dir=None, max_frame_bytes=None, heartbeat_ms=None, options=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        listen: String,
        client_token: Option<String>,
        worker_token: Option<String>,
        data_dir: Option<PathBuf>,
        max_frame_bytes: Option<usize>,
        heartbeat_ms: Option<u32>,
        options: Option<Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let mut cfg = config(
            listen,
            client_token,
            worker_token,
            data_dir,
            max_frame_bytes,
            heartbeat_ms,
        );
        apply_options(&mut cfg, options.as_ref())?;
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
#[pyo3(signature = (listen="127.0.0.1:7070".to_string(), data_dir=None, max_frame_bytes=None, heartbeat_ms=None, log_level="info".to_string(), options=None))]
fn run_master(
    py: Python<'_>,
    listen: String,
    data_dir: Option<PathBuf>,
    max_frame_bytes: Option<usize>,
    heartbeat_ms: Option<u32>,
    log_level: String,
    options: Option<Bound<'_, PyDict>>,
) -> PyResult<()> {
    rtpool_master::init_logging(&log_level);
    let mut cfg = config(listen, None, None, data_dir, max_frame_bytes, heartbeat_ms);
    apply_options(&mut cfg, options.as_ref())?;
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
