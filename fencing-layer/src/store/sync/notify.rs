//! A loom model of the part of tokio's `Notify` that admission uses:
//! `notified_owned` registers at once, and `notify_waiters` wakes every wake-up
//! registered before it and none registered after (no stored permit).
//! A wake-up nobody fires leaves its thread parked, which loom reports as a
//! deadlock: that is how the model finds a lost wake-up.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use loom::sync::Mutex;

#[derive(Debug, Default)]
pub(crate) struct Notify {
    // How many `notify_waiters` calls so far, and who sleeps until the next one.
    state: Mutex<(u64, Vec<Waker>)>,
}

impl Notify {
    pub(crate) fn notified_owned(self: Arc<Self>) -> OwnedNotified {
        let generation = self.state.lock().unwrap().0;
        OwnedNotified { notify: self, generation }
    }

    pub(crate) fn notify_waiters(&self) {
        let wakers = {
            let mut state = self.state.lock().unwrap();
            state.0 += 1;
            std::mem::take(&mut state.1)
        };
        wakers.into_iter().for_each(Waker::wake);
    }
}

#[derive(Debug)]
pub(crate) struct OwnedNotified {
    notify: Arc<Notify>,
    generation: u64,
}

impl Future for OwnedNotified {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut state = self.notify.state.lock().unwrap();
        if state.0 != self.generation {
            return Poll::Ready(());
        }
        state.1.push(cx.waker().clone());
        Poll::Pending
    }
}
