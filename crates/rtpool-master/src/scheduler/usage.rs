//! Users and their quotas in the scheduler: user names interned as core ids, quotas read from
//! the user store, and the compute time the core charged written behind to it (off the
//! scheduler task, since a store may block).

use tokio::sync::mpsc;
use tracing::warn;

use rtpool_core::{Event, UserId};

use super::{Scheduler, ToScheduler};
use crate::auth::Authenticator;
use crate::store::UserQuota;

impl Scheduler {
    /// The core id of a user name.
    pub(super) fn user_id(&mut self, name: &str) -> UserId {
        if let Some(&id) = self.users.get(name) {
            return id;
        }
        let id = UserId(self.user_names.len() as u64);
        self.user_names.push(name.to_owned());
        self.users.insert(name.to_owned(), id);
        id
    }

    /// Reads every user's quota from the store at start-up.
    pub(super) async fn load_quotas(&mut self) {
        let Some(auth) = self.auth.clone().filter(Authenticator::has_store) else {
            return;
        };
        match tokio::task::spawn_blocking(move || auth.quotas()).await {
            Ok(Ok(quotas)) => self.set_quotas(quotas),
            Ok(Err(e)) => warn!("cannot read quotas from the user store: {e}"),
            Err(e) => warn!("quota reader failed: {e}"),
        }
    }

    pub(super) fn set_quotas(&mut self, quotas: Vec<UserQuota>) {
        for q in quotas {
            let user = self.user_id(&q.user);
            self.status.recorder.set_stored(user, q.quota_us, q.used_us);
            let remaining_us = q
                .quota_us
                .map(|quota| quota as i64 - q.used_us.min(i64::MAX as u64) as i64);
            self.apply(Event::SetQuota { user, remaining_us });
        }
    }

    /// Usage charged since the last flush, by user name.
    fn take_usage(&mut self) -> Vec<(String, u64)> {
        self.core
            .take_usage()
            .into_iter()
            .map(|(user, us)| (self.user_names[user.0 as usize].clone(), us))
            .collect()
    }

    /// Writes the usage behind (off this task) and re-reads the quotas.
    pub(super) fn flush_usage(&mut self, tx: &mpsc::UnboundedSender<ToScheduler>) {
        let Some(auth) = self.auth.clone().filter(Authenticator::has_store) else {
            let _ = self.core.take_usage();
            return;
        };
        if self.flushing {
            return;
        }
        let usage = self.take_usage();
        self.flushing = true;
        let tx = tx.clone();
        // Every result charged so far was journaled at or before this LSN.
        let watermark = self.last_lsn;
        let journal = self.journal.clone();
        tokio::task::spawn_blocking(move || {
            if !usage.is_empty() {
                match auth.add_usage(&usage, watermark) {
                    Ok(()) => {
                        if let Some(j) = journal {
                            j.set_watermark(watermark);
                        }
                    }
                    Err(e) => warn!("cannot write usage to the user store: {e}"),
                }
            }
            match auth.quotas() {
                Ok(q) => drop(tx.send(ToScheduler::Quotas(q))),
                Err(e) => {
                    warn!("cannot read quotas from the user store: {e}");
                    drop(tx.send(ToScheduler::Quotas(Vec::new())));
                }
            }
        });
    }

    /// Writes the last usage at shutdown, and waits for it (off this task: a store may block).
    pub(super) async fn flush_usage_now(&mut self) {
        let Some(auth) = self.auth.clone().filter(Authenticator::has_store) else {
            return;
        };
        let usage = self.take_usage();
        if usage.is_empty() {
            return;
        }
        let watermark = self.last_lsn;
        let done = tokio::task::spawn_blocking(move || auth.add_usage(&usage, watermark)).await;
        match done {
            Ok(Ok(())) => {
                if let Some(j) = &self.journal {
                    j.set_watermark(watermark);
                }
            }
            Ok(Err(e)) => warn!("cannot write the last usage to the user store: {e}"),
            Err(e) => warn!("usage writer failed: {e}"),
        }
    }
}
