//! `rtpool._native.ScaleSim`: the simulated workers of [`rtpool_master::sim`] for
//! `rtpool bench scale` (python/rtpool_bench/scale.py), running on threads of their own with
//! the GIL released.

use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use rtpool_master::sim::{SimConfig, SimStats, Simulator};

/// Simulated one-connection workers speaking the real protocol to a master.
#[pyclass(module = "rtpool._native")]
pub struct ScaleSim {
    inner: Simulator,
}

fn stats_dict<'py>(py: Python<'py>, s: &SimStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("connected", s.connected)?;
    d.set_item("open", s.open)?;
    d.set_item("busy", s.busy)?;
    d.set_item("refused", s.refused)?;
    d.set_item("gave_up", s.gave_up)?;
    d.set_item("connect_errors", s.connect_errors)?;
    d.set_item("tasks", s.tasks)?;
    d.set_item("assign_frames", s.assign_frames)?;
    d.set_item("lease_lost", s.lease_lost)?;
    d.set_item("closed_by_master", s.closed_by_master)?;
    d.set_item("disconnected", s.disconnected)?;
    d.set_item("reconnected", s.reconnected)?;
    d.set_item("max_silence_ms", s.max_silence_ms)?;
    d.set_item("silent_past_lease", s.silent_past_lease)?;
    d.set_item("lease_lost_late", s.lease_lost_late)?;
    d.set_item("max_heartbeat_lag_ms", s.max_heartbeat_lag_ms)?;
    d.set_item("heartbeats_sent", s.heartbeats_sent)?;
    d.set_item("heartbeats_received", s.heartbeats_received)?;
    d.set_item("first_error", s.first_error.clone())?;
    Ok(d)
}

#[pymethods]
impl ScaleSim {
    #[new]
    #[pyo3(signature = (address, token, workers, *, slots=1, prefetch=1, handshake_concurrency=64, max_attempts=20, connect_timeout_s=10.0, threads=1))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        address: String,
        token: String,
        workers: usize,
        slots: u32,
        prefetch: u32,
        handshake_concurrency: usize,
        max_attempts: u32,
        connect_timeout_s: f64,
        threads: usize,
    ) -> PyResult<Self> {
        if slots == 0
            || max_attempts == 0
            || threads == 0
            || !connect_timeout_s.is_finite()
            || connect_timeout_s <= 0.0
        {
            return Err(PyValueError::new_err(format!(
                "ScaleSim needs slots >= 1, max_attempts >= 1, threads >= 1 and \
                 connect_timeout_s > 0 (got slots={slots}, max_attempts={max_attempts}, \
                 threads={threads}, connect_timeout_s={connect_timeout_s})"
            )));
        }
        let mut config = SimConfig::new(address, token, workers);
        config.slots = slots;
        config.prefetch = prefetch;
        config.handshake_concurrency = handshake_concurrency;
        config.max_attempts = max_attempts;
        config.connect_timeout = Duration::from_secs_f64(connect_timeout_s);
        config.threads = threads;
        let inner = Simulator::start(config)
            .map_err(|e| PyValueError::new_err(format!("cannot start the simulator: {e}")))?;
        Ok(Self { inner })
    }

    /// The counters now, as a dict (see `rtpool_master::sim::SimStats`).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        stats_dict(py, &self.inner.stats())
    }

    /// Close every connection and join the threads; returns the final counters. Idempotent.
    fn stop<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let inner = &mut self.inner;
        let s = py.allow_threads(|| inner.stop());
        stats_dict(py, &s)
    }
}
