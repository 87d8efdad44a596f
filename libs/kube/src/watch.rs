//! Watches that come back as soon as the API server does.
//!
//! kube-runtime's watcher re-lists by itself after a watch answered 410
//! Gone ("Expired": the resourceVersion it resumed from was compacted), but
//! it hands the error on first; kube's default backoff then pauses the
//! stream from 0.8 s up to 30 s after every error, the 410 included, and
//! after an API-server outage of some seconds the watch sat out up to half a
//! minute past its return. Here a 410 is not paused on at all — the re-list
//! starts at once — and other errors (the API server away, a timeout) are
//! tried again from 100 ms, doubling up to 1 s, so a watch re-lists within a
//! second of the API server's return.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use futures::{Stream, StreamExt};
use kube::runtime::watcher;

/// The pauses between attempts while the API server does not answer.
/// How long the API server keeps one watch open before it ends it (the
/// watcher then watches again from where it was, without a list). Without
/// it the server picks 30–60 minutes, and a connection that died silently
/// (no reset: a proxy or a NAT entry gone) held a watch that long.
pub const WATCH_TIMEOUT_SECONDS: u32 = 60;

/// How long a client waits on a connection that sends nothing: longer than
/// a watch lasts ([`WATCH_TIMEOUT_SECONDS`]), so only a dead connection
/// reaches it. kube's default is to wait for ever; a watch whose connection
/// stalled froze inventory's facts for good on toxiproxy (`timeout` toxic).
pub const READ_TIMEOUT: Duration = Duration::from_secs(WATCH_TIMEOUT_SECONDS as u64 + 15);

/// The watcher configuration Switchyard's watches use.
pub fn config() -> watcher::Config {
    watcher::Config::default().timeout(WATCH_TIMEOUT_SECONDS)
}

/// `config` with the read timeout every Switchyard client has.
pub fn client_config(mut config: kube::Config) -> kube::Config {
    config.read_timeout = Some(READ_TIMEOUT);
    config
}

fn pauses() -> ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(1))
        .with_jitter()
        .without_max_times()
        .build()
}

/// True for a watch the API server ended with 410 Gone: the watcher has
/// dropped its resourceVersion and lists again on its next poll.
pub fn is_gone(err: &watcher::Error) -> bool {
    match err {
        watcher::Error::WatchError(status) => status.code == 410,
        watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status))
        | watcher::Error::InitialListFailed(kube::Error::Api(status)) => status.code == 410,
        _ => false,
    }
}

/// `events` (a kube-runtime watcher) with its errors said in the log under
/// `what` and paced as the module says; the stream never ends on an error.
pub fn resilient<S, T>(events: S, what: String) -> impl Stream<Item = T> + Send
where
    S: Stream<Item = Result<T, watcher::Error>> + Send + 'static,
    T: Send + 'static,
{
    struct State<S> {
        events: std::pin::Pin<Box<S>>,
        pauses: ExponentialBackoff,
        what: String,
    }
    let state = State {
        events: Box::pin(events),
        pauses: pauses(),
        what,
    };
    futures::stream::unfold(state, |mut st| async move {
        loop {
            match st.events.next().await? {
                Ok(item) => {
                    st.pauses = pauses();
                    return Some((item, st));
                }
                Err(err) if is_gone(&err) => {
                    tracing::info!(watch = st.what, %err, "watch expired; listing again now");
                }
                Err(err) => {
                    let pause = st.pauses.next().unwrap_or(Duration::from_secs(1));
                    tracing::warn!(watch = st.what, %err, ?pause, "watch failed; trying again");
                    // A retry pace while the API server is away, not a wait for an event.
                    tokio::time::sleep(pause).await;
                }
            }
        }
    })
}
