//! The penalty box on Redis: each key's strikes in a record next to its
//! limit's state (`<prefix>{<key>}:<limit>:box`, the same slot on a
//! cluster), changed by `penalty.lua` on Redis's clock; the bans in force
//! in one hash, `<prefix>{bans}` (`<limit>\n<key>` -> `<until>:<level>`),
//! announced on the channel `<prefix>bans` so every replica's copy
//! ([`PenaltyBox`]) refuses the key from its next request.
//!
//! A replica (re)subscribing reads the whole hash, and writes back the
//! bans it holds that Redis lost (a restart without persistence, a ban
//! started while Redis was down): a ban is never dropped silently.

use std::sync::Weak;
use std::time::Duration;

use futures_util::StreamExt;

use super::{LimiterError, RedisStore};
use crate::limiter::penalty::{Ban, PenaltyBox, Rules};

const PENALTY: &str = include_str!("penalty.lua");

/// The hash of bans in force and the channel they are announced on.
fn names(prefix: &str) -> (String, String) {
    (format!("{prefix}{{bans}}"), format!("{prefix}bans"))
}

fn field(name: &str, key: &str) -> String {
    format!("{name}\n{key}")
}

impl RedisStore {
    fn record(&self, name: &str, key: &str) -> String {
        format!("{}{{{key}}}:{name}:box", self.prefix)
    }

    /// Records a refusal of `key` under limit `name`; a ban it starts is
    /// put in the hash and announced.
    pub async fn strike(
        &self,
        name: &str,
        key: &str,
        rules: &Rules,
    ) -> Result<Option<(Ban, bool)>, LimiterError> {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(PENALTY)
            .arg(1)
            .arg(self.record(name, key))
            .arg(self.pinned())
            .arg(rules.after)
            .arg(rules.within_ms)
            .arg(rules.forgive_ms);
        for b in rules.bans_ms.iter() {
            cmd.arg(*b);
        }
        let (until, level, started): (u64, u32, u8) = self.command(&mut cmd).await?;
        if until == 0 {
            return Ok(None);
        }
        let ban = Ban { until, level };
        if started == 1 {
            self.announce(name, key, ban).await?;
        }
        Ok(Some((ban, started == 1)))
    }

    async fn announce(&self, name: &str, key: &str, ban: Ban) -> Result<(), LimiterError> {
        let (hash, channel) = names(&self.prefix);
        let value = format!("{}:{}", ban.until, ban.level);
        self.command::<i64>(
            redis::cmd("HSET")
                .arg(&hash)
                .arg(field(name, key))
                .arg(&value),
        )
        .await?;
        let message = format!("ban\n{}\n{value}", field(name, key));
        self.command::<i64>(redis::cmd("PUBLISH").arg(&channel).arg(message))
            .await?;
        Ok(())
    }

    /// Lifts a ban (and forgets the key's strikes) everywhere. Whether
    /// Redis held one.
    pub async fn lift(&self, name: &str, key: &str) -> Result<bool, LimiterError> {
        let (hash, channel) = names(&self.prefix);
        let _: i64 = self
            .command(redis::cmd("DEL").arg(self.record(name, key)))
            .await?;
        let removed: i64 = self
            .command(redis::cmd("HDEL").arg(&hash).arg(field(name, key)))
            .await?;
        let message = format!("lift\n{}", field(name, key));
        self.command::<i64>(redis::cmd("PUBLISH").arg(&channel).arg(message))
            .await?;
        Ok(removed > 0)
    }

    /// The bans in the hash: (limit, key, ban); ended ones are dropped
    /// from it on the way.
    pub async fn load_bans(&self, now: u64) -> Result<Vec<(String, String, Ban)>, LimiterError> {
        let (hash, _) = names(&self.prefix);
        let all: Vec<(String, String)> = self.command(redis::cmd("HGETALL").arg(&hash)).await?;
        let mut out = Vec::new();
        let mut ended = Vec::new();
        for (f, v) in all {
            let (Some((name, key)), Some(ban)) = (f.split_once('\n'), parse_ban(&v)) else {
                continue;
            };
            if ban.until <= now {
                ended.push(f.clone());
                continue;
            }
            out.push((name.to_owned(), key.to_owned(), ban));
        }
        if !ended.is_empty() {
            let _: i64 = self
                .command(redis::cmd("HDEL").arg(&hash).arg(&ended))
                .await?;
        }
        Ok(out)
    }

    /// Writes back a ban Redis lost: its record (so the next strike
    /// escalates from it) and its entry in the hash, unless Redis holds a
    /// later one.
    pub async fn restore(
        &self,
        name: &str,
        key: &str,
        ban: Ban,
        now: u64,
    ) -> Result<(), LimiterError> {
        let left = ban.until.saturating_sub(now).max(1);
        let record = format!("0:{now}:{}:{}", ban.level, ban.until);
        let _: Option<String> = self
            .command(
                redis::cmd("SET")
                    .arg(self.record(name, key))
                    .arg(record)
                    .arg("NX")
                    .arg("PX")
                    .arg(left),
            )
            .await?;
        self.announce(name, key, ban).await
    }

    /// Writes `ban` (started by this replica while Redis failed) to Redis
    /// once it answers again: tried every probe interval until it is
    /// written or has ended, so it reaches the other replicas.
    pub fn restore_later(&self, name: &str, key: &str, ban: Ban) {
        let (store, alive) = self.handle();
        let (name, key) = (name.to_owned(), key.to_owned());
        let retry = self.options.probe_interval.max(Duration::from_millis(100));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(retry).await;
                let now = store.clock.unix_ms();
                if alive.strong_count() == 0 || ban.until <= now {
                    return;
                }
                if store.restore(&name, &key, ban, now).await.is_ok() {
                    tracing::info!(limit = %name, "penalty box: a ban started while Redis failed is now in Redis");
                    return;
                }
            }
        });
    }

    /// Keeps `table` a copy of the bans in force: reads them at every
    /// (re)subscription, writing back those Redis lost, then follows the
    /// announcements. Ends when the table is gone.
    pub fn watch_bans(&self, table: Weak<PenaltyBox>) {
        let Some(client) = super::setup::subscriber(&self.options) else {
            return;
        };
        let (store, alive) = self.handle();
        let retry = self.options.probe_interval;
        tokio::spawn(async move {
            let (_, channel) = names(&store.prefix);
            loop {
                if alive.strong_count() == 0 {
                    return;
                }
                if let Ok(pubsub) = super::resets::subscribe(&client, &channel).await {
                    // (Redis may answer commands a moment after it takes
                    // subscriptions: until it does, the copy stands)
                    loop {
                        let Some(t) = table.upgrade() else { return };
                        if store.sync_bans(&t).await || alive.strong_count() == 0 {
                            break;
                        }
                        drop(t);
                        tokio::time::sleep(retry.max(Duration::from_millis(100))).await;
                    }
                    let mut messages = pubsub.into_on_message();
                    while let Some(msg) = messages.next().await {
                        let Some(t) = table.upgrade() else { return };
                        if alive.strong_count() == 0 {
                            return;
                        }
                        if let Ok(text) = msg.get_payload::<String>() {
                            apply(&t, &text, store.clock.unix_ms());
                        }
                    }
                    tracing::debug!("rate-limit store: ban subscription lost; resubscribing");
                }
                if table.strong_count() == 0 {
                    return;
                }
                tokio::time::sleep(retry.max(Duration::from_millis(100))).await;
            }
        });
    }

    /// Reads the bans Redis holds into `table`, and writes back the ones
    /// only `table` holds. Whether Redis answered.
    async fn sync_bans(&self, table: &PenaltyBox) -> bool {
        let now = self.clock.unix_ms();
        let held = match self.load_bans(now).await {
            Ok(h) => h,
            Err(e) => {
                tracing::debug!(error = %e, "penalty box: cannot read the bans from Redis yet; this replica's own stand");
                return false;
            }
        };
        for (name, key, ban) in &held {
            table.put(name, key, *ban, now);
        }
        let mut restored = 0;
        for (name, key, ban) in table.list(now) {
            let known = held
                .iter()
                .any(|(n, k, b)| **n == *name && *k == key && b.until >= ban.until);
            if !known && self.restore(&name, &key, ban, now).await.is_ok() {
                restored += 1;
            }
        }
        if restored > 0 {
            tracing::warn!(
                restored,
                "penalty box: Redis had lost bans this replica holds; written back"
            );
        }
        true
    }
}

fn parse_ban(v: &str) -> Option<Ban> {
    let (until, level) = v.split_once(':')?;
    Some(Ban {
        until: until.parse().ok()?,
        level: level.parse().ok()?,
    })
}

/// An announcement: "ban\n<limit>\n<key>\n<until>:<level>" or
/// "lift\n<limit>\n<key>".
fn apply(table: &PenaltyBox, text: &str, now: u64) {
    let mut parts = text.splitn(4, '\n');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some("ban"), Some(name), Some(key), Some(v)) => {
            if let Some(ban) = parse_ban(v) {
                table.put(name, key, ban, now);
            }
        }
        (Some("lift"), Some(name), Some(key), None) => {
            table.lift(name, key, now);
        }
        _ => {}
    }
}
