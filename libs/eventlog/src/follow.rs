//! Following a log: read pages until caught up, then wait for the next commit.

use std::collections::VecDeque;
use std::future::Future;

use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::watch;

use crate::{LogError, StoredEvent};

/// A stream of events from `from` on that never ends while the log is open:
/// `fetch(next)` returns the next page of committed events, `changes` ticks when
/// more are committed.
pub(crate) fn paged<F, Fut>(
    from: u64,
    fetch: F,
    changes: watch::Receiver<u64>,
) -> BoxStream<'static, Result<StoredEvent, LogError>>
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Vec<StoredEvent>, LogError>> + Send + 'static,
{
    struct State<F> {
        next: u64,
        page: VecDeque<StoredEvent>,
        changes: watch::Receiver<u64>,
        fetch: F,
        failed: bool,
    }
    let state = State {
        next: from.max(1),
        page: VecDeque::new(),
        changes,
        fetch,
        failed: false,
    };
    futures::stream::unfold(state, |mut st| async move {
        loop {
            if st.failed {
                return None;
            }
            if let Some(event) = st.page.pop_front() {
                st.next = event.sequence + 1;
                return Some((Ok(event), st));
            }
            // Mark the current commit as seen before reading, so a commit that
            // lands during the read wakes the wait below instead of being missed.
            st.changes.borrow_and_update();
            match (st.fetch)(st.next).await {
                Err(err) => {
                    st.failed = true;
                    return Some((Err(err), st));
                }
                Ok(page) if page.is_empty() => {
                    if st.changes.changed().await.is_err() {
                        return None;
                    }
                }
                Ok(page) => st.page.extend(page),
            }
        }
    })
    .boxed()
}
