//! What the failure of one of an engine's threads tells the application
//! ([`super::XdpEngine::on_failure`], the device's asynchronous `DeviceFatal`).

use std::sync::{Arc, Mutex};

/// What an engine's failure calls ([`super::XdpEngine::on_failure`]): once for the engine, whichever
/// of its threads fails first.
#[derive(Default)]
pub(crate) struct FailureNotice {
    /// Failed yet, and the hook.
    state: Mutex<(bool, Option<FailureHook>)>,
}

/// A hook of [`FailureNotice`].
pub(crate) type FailureHook = Arc<dyn Fn() + Send + Sync>;

impl FailureNotice {
    /// An engine thread failed: the hook is called unless it was already (outside the lock).
    pub(crate) fn fail(&self) {
        let hook = {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if st.0 {
                return;
            }
            st.0 = true;
            st.1.clone()
        };
        if let Some(hook) = hook {
            hook();
        }
    }

    pub(crate) fn set(&self, hook: FailureHook) {
        let failed = {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            st.1 = Some(hook.clone());
            st.0
        };
        if failed {
            hook();
        }
    }
}
