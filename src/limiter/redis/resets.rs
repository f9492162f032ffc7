//! Resets announced to every replica: a key reset through the admin API on
//! one replica must not stay refused by another replica's rejection cache.
//! The replica that resets a key publishes `<limit suffix>\n<key>` on
//! `<prefix>resets`; every replica subscribes and forgets the key. On a
//! cluster, Redis carries a publication to every node.
//!
//! A replica that loses its subscription clears its whole cache once it is
//! subscribed again, so a reset published meanwhile is never missed (the
//! cache only saves round trips; an empty cache decides the same).

use std::sync::Weak;
use std::time::Duration;

use futures_util::StreamExt;

use super::cache::RejectCache;

/// The channel resets are published on.
pub fn channel(prefix: &str) -> String {
    format!("{prefix}resets")
}

/// What is published for `key` of the limit whose Redis key ends in `suffix`.
pub fn message(suffix: &str, key: &str) -> String {
    format!("{suffix}\n{key}")
}

/// Listens until the cache is gone (the store was dropped).
pub async fn listen(
    client: redis::Client,
    channel: String,
    cache: Weak<RejectCache>,
    retry: Duration,
) {
    loop {
        match subscribe(&client, &channel).await {
            Ok(mut pubsub) => {
                match cache.upgrade() {
                    Some(c) => c.clear(),
                    None => return,
                }
                let mut messages = pubsub.on_message();
                while let Some(msg) = messages.next().await {
                    let Some(cache) = cache.upgrade() else {
                        return;
                    };
                    let Ok(payload) = msg.get_payload::<String>() else {
                        continue;
                    };
                    if let Some((suffix, key)) = payload.split_once('\n') {
                        cache.forget(suffix, key);
                    }
                }
                tracing::debug!("rate-limit store: reset subscription lost; resubscribing");
            }
            Err(e) => {
                tracing::debug!(error = %super::describe(&e), "rate-limit store: cannot subscribe to resets yet")
            }
        }
        if cache.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(retry).await;
    }
}

pub(super) async fn subscribe(
    client: &redis::Client,
    channel: &str,
) -> redis::RedisResult<redis::aio::PubSub> {
    let mut pubsub = client.get_async_pubsub().await?;
    pubsub.subscribe(channel).await?;
    Ok(pubsub)
}
