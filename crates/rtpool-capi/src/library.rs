//! The library's state between `grpc_initialize` and `grpc_finalize`: the settings, one
//! connection per master (shared by every handle on it), the function handles, the sessions.
//!
//! The state is one `Arc` behind a lock taken only to look it up, so calls from several
//! threads run at once; each table has its own lock, none held across a network wait but a
//! first connection's (a second handle on the same master waits for it rather than opening
//! another).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use crate::backend::{Backend, HandleOptions};
use crate::config::Settings;
use crate::error::{
    CapiError, GRPC_ALREADY_INITIALIZED, GRPC_INVALID_FUNCTION_HANDLE, GRPC_NOT_INITIALIZED,
};
use crate::sessions::Sessions;
use crate::signature::Signature;

/// A GridRPC function handle: an opaque id the library hands out (0: none).
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default)]
pub struct grpc_function_handle_t {
    /// The library's id of the handle; 0 before `grpc_function_handle_init`, after `_destruct`.
    pub id: u64,
}

/// A bound function: its master, name, interface and options.
pub struct Handle {
    /// The master's connection.
    pub backend: Arc<Backend>,
    /// The function's name.
    pub function: String,
    /// Its interface, fetched when the handle was made.
    pub signature: Signature,
    /// Per-handle options.
    pub options: Mutex<HandleOptions>,
}

/// Everything `grpc_initialize` sets up.
pub struct Library {
    settings: Settings,
    backends: Mutex<HashMap<String, Arc<Backend>>>,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    next_handle: AtomicU64,
    /// The asynchronous calls.
    pub sessions: Arc<Sessions>,
}

static LIBRARY: RwLock<Option<Arc<Library>>> = RwLock::new(None);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Start the library with `settings`.
///
/// # Errors
///
/// `GRPC_ALREADY_INITIALIZED`.
pub fn initialize(settings: Settings) -> Result<(), CapiError> {
    let mut slot = LIBRARY.write().unwrap_or_else(|e| e.into_inner());
    if slot.is_some() {
        return Err(CapiError::new(
            GRPC_ALREADY_INITIALIZED,
            "grpc_initialize was called already; call grpc_finalize first",
        ));
    }
    *slot = Some(Arc::new(Library {
        settings,
        backends: Mutex::default(),
        handles: Mutex::default(),
        next_handle: AtomicU64::new(1),
        sessions: Arc::default(),
    }));
    Ok(())
}

/// Stop the library: close every connection (calls still pending fail) and forget every
/// handle and session.
///
/// # Errors
///
/// `GRPC_NOT_INITIALIZED`.
pub fn finalize() -> Result<(), CapiError> {
    let library = LIBRARY
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .take()
        .ok_or_else(not_initialized)?;
    let backends: Vec<Arc<Backend>> = lock(&library.backends).drain().map(|(_, b)| b).collect();
    lock(&library.handles).clear();
    for backend in backends {
        backend.close();
    }
    Ok(())
}

/// The running library.
///
/// # Errors
///
/// `GRPC_NOT_INITIALIZED`.
pub fn current() -> Result<Arc<Library>, CapiError> {
    LIBRARY
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .ok_or_else(not_initialized)
}

fn not_initialized() -> CapiError {
    CapiError::new(
        GRPC_NOT_INITIALIZED,
        "GridRPC is not initialized: call grpc_initialize(config_file) first",
    )
}

impl Library {
    /// A handle on `function` at the master `server` (`None`: the default master).
    ///
    /// # Errors
    ///
    /// `GRPC_SERVER_NOT_FOUND`, `GRPC_RPC_REFUSED`, `GRPC_FUNCTION_NOT_FOUND`.
    pub fn bind(
        &self,
        server: Option<&str>,
        function: &str,
    ) -> Result<grpc_function_handle_t, CapiError> {
        let address = server.map_or_else(|| self.settings.default_master(), str::to_owned);
        let backend = self.backend(&address)?;
        let signature = backend.signature(function)?;
        let id = self.next_handle.fetch_add(1, Ordering::Relaxed);
        let handle = Handle {
            backend,
            function: function.to_owned(),
            signature,
            options: Mutex::default(),
        };
        lock(&self.handles).insert(id, Arc::new(handle));
        Ok(grpc_function_handle_t { id })
    }

    fn backend(&self, address: &str) -> Result<Arc<Backend>, CapiError> {
        let mut backends = lock(&self.backends);
        if let Some(b) = backends.get(address) {
            return Ok(b.clone());
        }
        let backend = Arc::new(Backend::connect(&self.settings, address)?);
        backends.insert(address.to_owned(), backend.clone());
        Ok(backend)
    }

    /// The handle behind `handle`.
    ///
    /// # Errors
    ///
    /// `GRPC_INVALID_FUNCTION_HANDLE` for an id never handed out or destructed.
    pub fn handle(&self, handle: grpc_function_handle_t) -> Result<Arc<Handle>, CapiError> {
        lock(&self.handles)
            .get(&handle.id)
            .cloned()
            .ok_or_else(|| invalid_handle(handle.id))
    }

    /// Forget a handle.
    ///
    /// # Errors
    ///
    /// `GRPC_INVALID_FUNCTION_HANDLE`.
    pub fn destruct(&self, handle: grpc_function_handle_t) -> Result<(), CapiError> {
        lock(&self.handles)
            .remove(&handle.id)
            .map(drop)
            .ok_or_else(|| invalid_handle(handle.id))
    }
}

/// The error of a bad handle id.
pub fn invalid_handle(id: u64) -> CapiError {
    let what = if id == 0 {
        "was never initialized (or was destructed)".to_owned()
    } else {
        format!("{id} is unknown (destructed, or from before grpc_finalize)")
    };
    CapiError::new(
        GRPC_INVALID_FUNCTION_HANDLE,
        format!("function handle {what}; call grpc_function_handle_init first"),
    )
}
