//! A location as a route: its zones, its sources and a unique name.

use super::{Action, Inherited, Note, Out, Route, Severity, Use, NGINX_STATUS};
use crate::import::reader::Place;

pub(super) fn add_route(
    out: &mut Out,
    host: &Option<String>,
    exact: bool,
    path: &str,
    action: Option<Action>,
    inh: &Inherited,
    at: &Place,
) {
    let Some(action) = action else { return };
    if let Some(other) = out
        .routes
        .iter()
        .find(|r| r.host == *host && r.exact == exact && r.path == path)
    {
        let message = format!(
            "location {path} for host {} is already answered by route {} (servers on other listeners?): tollgate routes by host and path, not by listener",
            host.as_deref().unwrap_or("(any)"),
            other.name
        );
        out.note(at, Severity::Lost, message);
        return;
    }
    // nginx runs `return` in its rewrite phase, before limit_req,
    // limit_conn (preaccess) and allow / deny (access): none of them
    // applies to a location that returns.
    let responds = matches!(action, Action::Respond(_));
    let (zones, comments) = if responds {
        let limited = inh.limit_req.as_ref().is_some_and(|l| !l.is_empty())
            || inh.limit_conn.as_ref().is_some_and(|l| !l.is_empty());
        let why = "not limited: nginx answers `return` in its rewrite phase, before limit_req and limit_conn run";
        (
            Vec::new(),
            if limited {
                vec![why.to_owned()]
            } else {
                Vec::new()
            },
        )
    } else {
        zones(out, inh)
    };
    let webhook = if responds {
        if let Some((_, _, place)) = inh.allow.first() {
            let message = "allow / deny have no effect where nginx answers with return (its rewrite phase runs before access checks); not translated";
            out.note(place, Severity::Skipped, message);
        }
        None
    } else {
        allow_deny(inh, !zones.is_empty(), out)
    };
    let base = if exact {
        path.to_owned()
    } else {
        path.trim_end_matches('/').to_owned()
    };
    let mut name: String = base
        .trim_start_matches('/')
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    if name.is_empty() {
        name = "root".into();
    }
    if exact {
        name.push_str("-exact");
    }
    if let Some(h) = host {
        name = format!("{}-{name}", h.replace('*', "any").replace('.', "-"));
    }
    let mut unique = name.clone();
    let mut i = 2;
    while out.routes.iter().any(|r| r.name == unique) {
        unique = format!("{name}-{i}");
        i += 1;
    }
    out.routes.push(Route {
        name: unique,
        host: host.clone(),
        exact,
        path: path.to_owned(),
        action,
        zones,
        body_size: inh.body_size.clone(),
        webhook,
        comments,
    });
}

/// The zones a route lists: the `limit_req` and `limit_conn` its location
/// has or inherits, each noted where it cannot be used as nginx uses it;
/// and comments for the route on the ones it cannot list.
fn zones(out: &mut Out, inh: &Inherited) -> (Vec<String>, Vec<String>) {
    let mut zones = Vec::new();
    let mut comments = Vec::new();
    let untranslated = |zone: &str, what: &str, place: &Place| {
        format!("zone {zone} ({what} at {place}) is NOT applied: its key could not be translated (see zones)")
    };
    let status = inh
        .req_status
        .clone()
        .unwrap_or_else(|| NGINX_STATUS.into());
    for (args, place) in inh.limit_req.iter().flatten() {
        let named = |p: &str| {
            args.iter()
                .find_map(|a| a.strip_prefix(p))
                .map(str::to_owned)
        };
        let Some(zone) = named("zone=") else {
            out.note(place, Severity::Lost, "limit_req without zone=");
            continue;
        };
        let u = Use {
            burst: named("burst=").and_then(|b| b.parse().ok()).unwrap_or(0),
            delay: if args.iter().any(|a| a == "nodelay") {
                None
            } else {
                Some(named("delay=").and_then(|b| b.parse().ok()).unwrap_or(0))
            },
            status: status.clone(),
            dry_run: inh.dry_run.unwrap_or(false),
        };
        match out.req_zones.get(&zone) {
            None => {
                out.note(
                    place,
                    Severity::Lost,
                    format!("limit_req zone={zone}: no limit_req_zone defines it"),
                );
                continue;
            }
            // Reported once, with the zone (a route cannot list it).
            Some(z) if z.key.is_err() => {
                comments.push(untranslated(&zone, "limit_req", place));
                out.used.entry(zone.clone()).or_insert((u, place.clone()));
                continue;
            }
            Some(_) => {}
        }
        match out.used.get(&zone) {
            Some((first, first_at)) if *first != u => {
                let message = format!(
                    "zone {zone} is used here with other settings than at {first_at} (burst, delay, status or dry run); a tollgate zone has one of each: this location uses the first"
                );
                out.note(place, Severity::Lost, message);
            }
            Some(_) => {}
            None => {
                out.used.insert(zone.clone(), (u, place.clone()));
            }
        }
        zones.push(zone);
    }
    let conn_status = inh
        .conn_status
        .clone()
        .unwrap_or_else(|| NGINX_STATUS.into());
    for (zone, n, place) in inh.limit_conn.iter().flatten() {
        match out.conn_zones.get(zone) {
            None => {
                out.note(
                    place,
                    Severity::Lost,
                    format!("limit_conn {zone}: no limit_conn_zone defines it"),
                );
                continue;
            }
            Some(z) if z.key.is_err() => {
                comments.push(untranslated(zone, "limit_conn", place));
                let first = (n.parse().unwrap_or(1), conn_status.clone(), place.clone());
                out.conn_used.entry(zone.clone()).or_insert(first);
                continue;
            }
            Some(_) => {}
        }
        let n: u32 = n.parse().unwrap_or(1);
        match out.conn_used.get(zone) {
            Some((m, s, first_at)) if (*m, s.as_str()) != (n, conn_status.as_str()) => {
                let message = format!("limit_conn {zone} is used here with another number or status than at {first_at}; this location uses the first");
                out.note(place, Severity::Lost, message);
            }
            Some(_) => {}
            None => {
                out.conn_used
                    .insert(zone.clone(), (n, conn_status.clone(), place.clone()));
            }
        }
        zones.push(format!("{zone}_conn"));
    }
    (zones, comments)
}

/// `allow` / `deny` as webhook sources, when the meaning is the same:
/// `allow <nets>; deny all;` on a location without limits.
fn allow_deny(inh: &Inherited, limited: bool, out: &mut Out) -> Option<(Vec<String>, bool)> {
    if inh.allow.is_empty() {
        return None;
    }
    let at = inh.allow[0].2.clone();
    let (last, allows) = inh.allow.split_last()?;
    let shape = allows.iter().all(|(k, _, _)| k == "allow") && last.0 == "deny" && last.1 == "all";
    if !shape {
        out.note(
            &at,
            Severity::Lost,
            "allow / deny other than \"allow ...; deny all;\" is not translated",
        );
        return None;
    }
    if limited {
        out.note(&at, Severity::Lost, "allow / deny on a limited location: tollgate's allow_sources also skip the limits, which nginx does not");
        return None;
    }
    Some((allows.iter().map(|(_, net, _)| net.clone()).collect(), true))
}

/// A zone's key kind, or `None` with the reason noted (once per zone).
pub(super) fn usable_key(
    key: &Result<String, String>,
    at: &Place,
    notes: &mut Vec<Note>,
) -> Option<String> {
    match key {
        Ok(k) => Some(k.clone()),
        Err(why) => {
            notes.push(Note {
                at: at.clone(),
                severity: Severity::Lost,
                message: why.clone(),
            });
            None
        }
    }
}
