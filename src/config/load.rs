//! The loader: YAML text -> the raw types in `raw`.
//!
//! Loading reads the file into a `serde_yaml::Value`, replaces `${VAR}` in
//! string values from the environment (after parsing, so a variable can never
//! inject YAML structure), then deserialises each section and each list item
//! on its own. One bad route therefore does not hide a bad upstream: every
//! problem is collected with its YAML path and handed to `validate`.

use serde::de::DeserializeOwned;
use serde_yaml::Value;

use super::raw::RawConfig;
use super::Problem;

/// The top-level keys this version understands, in the order `check` lists them.
const SECTIONS: &[&str] = &[
    "listeners",
    "admin",
    "server",
    "client_ip",
    "identity",
    "store",
    "bypass",
    "zones",
    "priorities",
    "upstreams",
    "routes",
    "log",
    "alerts",
    "traces",
];

/// Parses YAML text into raw sections, collecting every problem found.
/// `lookup` resolves `${VAR}` (the environment in production, a map in tests).
pub fn load(text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> (RawConfig, Vec<Problem>) {
    let mut problems = Vec::new();
    let mut raw = RawConfig::default();
    let mut doc: Value = match serde_yaml::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            let line = e.location().map(|l| l.line());
            problems.push(Problem {
                path: "(file)".into(),
                message: e.to_string(),
                line,
            });
            return (raw, problems);
        }
    };
    substitute_env(&mut doc, String::new(), lookup, &mut problems);
    let map = match doc {
        Value::Mapping(m) => m,
        Value::Null => {
            problems.push(Problem::new("(file)", "the file is empty"));
            return (raw, problems);
        }
        other => {
            problems.push(Problem::new(
                "(file)",
                format!("expected a mapping of sections, got {}", describe(&other)),
            ));
            return (raw, problems);
        }
    };
    for (key, value) in map {
        let Some(name) = key.as_str() else {
            problems.push(Problem::new(
                "(file)",
                format!("section names are strings, got {}", describe(&key)),
            ));
            continue;
        };
        match name {
            "listeners" => raw.listeners = list(value, "listeners", &mut problems),
            "routes" => raw.routes = list(value, "routes", &mut problems),
            "admin" => raw.admin = one(value, "admin", &mut problems),
            "server" => raw.server = one(value, "server", &mut problems),
            "log" => raw.log = one(value, "log", &mut problems),
            "client_ip" => raw.client_ip = one(value, "client_ip", &mut problems),
            "zones" => raw.zones = list(value, "zones", &mut problems),
            "bypass" => raw.bypass = one(value, "bypass", &mut problems),
            "store" => raw.store = one(value, "store", &mut problems),
            "alerts" => raw.alerts = one(value, "alerts", &mut problems),
            "traces" => raw.traces = one(value, "traces", &mut problems),
            "identity" => raw.identity = one(value, "identity", &mut problems),
            "upstreams" => raw.upstreams = named(value, "upstreams", &mut problems),
            "priorities" => raw.priorities = one(value, "priorities", &mut problems),
            other => problems.push(Problem::new(
                other,
                format!("unknown section; expected one of: {}", SECTIONS.join(", ")),
            )),
        }
    }
    (raw, problems)
}

/// Deserialises one section, reporting a failure at its full YAML path.
fn one<T: DeserializeOwned>(value: Value, path: &str, problems: &mut Vec<Problem>) -> Option<T> {
    if value.is_null() {
        return None;
    }
    match serde_path_to_error::deserialize::<_, T>(value) {
        Ok(v) => Some(v),
        Err(e) => {
            let inner = e.path().to_string();
            let full = if inner == "." {
                path.to_owned()
            } else {
                format!("{path}.{inner}")
            };
            problems.push(Problem::new(
                full,
                clean_serde_message(&e.into_inner().to_string()),
            ));
            None
        }
    }
}

/// Deserialises a YAML list item by item, keeping each item's path.
fn list<T: DeserializeOwned>(
    value: Value,
    path: &str,
    problems: &mut Vec<Problem>,
) -> Vec<(String, T)> {
    match value {
        Value::Null => Vec::new(),
        Value::Sequence(items) => items
            .into_iter()
            .enumerate()
            .filter_map(|(i, item)| {
                let item_path = format!("{path}[{i}]");
                one(item, &item_path, problems).map(|v| (item_path, v))
            })
            .collect(),
        other => {
            problems.push(Problem::new(
                path,
                format!("expected a list, got {}", describe(&other)),
            ));
            Vec::new()
        }
    }
}

/// Deserialises a YAML mapping of name -> item, returning (path, name, item).
fn named<T: DeserializeOwned>(
    value: Value,
    path: &str,
    problems: &mut Vec<Problem>,
) -> Vec<(String, String, T)> {
    match value {
        Value::Null => Vec::new(),
        Value::Mapping(entries) => entries
            .into_iter()
            .filter_map(|(k, v)| {
                let Some(name) = k.as_str().map(str::to_owned) else {
                    problems.push(Problem::new(
                        path,
                        format!("names are strings, got {}", describe(&k)),
                    ));
                    return None;
                };
                let item_path = format!("{path}.{name}");
                one(v, &item_path, problems).map(|item| (item_path, name, item))
            })
            .collect(),
        other => {
            problems.push(Problem::new(
                path,
                format!(
                    "expected a mapping of name -> settings, got {}",
                    describe(&other)
                ),
            ));
            Vec::new()
        }
    }
}

/// Replaces `${VAR}` inside every string value. `$${` writes a literal `${`.
fn substitute_env(
    value: &mut Value,
    path: String,
    lookup: &dyn Fn(&str) -> Option<String>,
    problems: &mut Vec<Problem>,
) {
    match value {
        Value::String(s) if s.contains("${") => match expand(s, lookup) {
            Ok(expanded) => *s = expanded,
            Err(message) => problems.push(Problem::new(path, message)),
        },
        Value::Sequence(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                substitute_env(item, format!("{path}[{i}]"), lookup, problems);
            }
        }
        Value::Mapping(map) => {
            for (k, v) in map.iter_mut() {
                let key = k.as_str().unwrap_or("?");
                let child = if path.is_empty() {
                    key.to_owned()
                } else {
                    format!("{path}.{key}")
                };
                substitute_env(v, child, lookup, problems);
            }
        }
        _ => {}
    }
}

fn expand(s: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(start) = rest.find('$') {
        out.push_str(&rest[..start]);
        let after = &rest[start..];
        if let Some(tail) = after.strip_prefix("$${") {
            out.push_str("${");
            rest = tail;
        } else if let Some(tail) = after.strip_prefix("${") {
            let end = tail
                .find('}')
                .ok_or_else(|| format!("unclosed \"${{\" in \"{s}\""))?;
            let name = &tail[..end];
            let valid =
                !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !valid {
                return Err(format!(
                    "\"${{{name}}}\" is not a valid environment variable name"
                ));
            }
            let value =
                lookup(name).ok_or_else(|| format!("environment variable {name} is not set"))?;
            out.push_str(&value);
            rest = &tail[end + 1..];
        } else {
            out.push('$');
            rest = &after[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

pub(super) fn describe(v: &Value) -> String {
    match v {
        Value::Null => "nothing".into(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("the string \"{s}\""),
        Value::Sequence(_) => "a list".into(),
        Value::Mapping(_) => "a mapping".into(),
        Value::Tagged(_) => "a tagged value".into(),
    }
}

/// serde's messages are good but sometimes end with a position that is
/// meaningless after we split the document; drop it.
fn clean_serde_message(message: &str) -> String {
    match message.find(" at line ") {
        Some(i) => message[..i].to_owned(),
        None => message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "TOKEN" => Some("s3cret".into()),
            "PORT" => Some("8081".into()),
            _ => None,
        }
    }

    #[test]
    fn variables_expand_inside_strings() {
        assert_eq!(expand("Bearer ${TOKEN}", &env).unwrap(), "Bearer s3cret");
        assert_eq!(expand("127.0.0.1:${PORT}", &env).unwrap(), "127.0.0.1:8081");
        assert_eq!(
            expand("cost $5 and $${TOKEN}", &env).unwrap(),
            "cost $5 and ${TOKEN}"
        );
    }

    #[test]
    fn a_missing_variable_is_named() {
        let err = expand("${NOPE}", &env).unwrap_err();
        assert_eq!(err, "environment variable NOPE is not set");
        assert!(expand("${bad-name}", &env)
            .unwrap_err()
            .contains("not a valid"));
        assert!(expand("${TOKEN", &env).unwrap_err().contains("unclosed"));
    }

    #[test]
    fn problems_in_different_sections_are_all_reported() {
        let yaml = "
listeners:
  - { bind: '127.0.0.1:0', colour: blue }
  - { bind: '127.0.0.1:0' }
routes:
  - { match: { path: / }, respond: { body: ok } }
  - { match: { path: / }, upstream: [1] }
server: { max_body_size: '${MISSING}' }
extra: 1
";
        let (raw, problems) = load(yaml, &env);
        let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(raw.listeners.len(), 1, "the good listener survives");
        assert_eq!(raw.routes.len(), 1, "the good route survives");
        assert!(paths.contains(&"listeners[0].colour"), "{problems:?}");
        assert!(paths.contains(&"routes[1].upstream"), "{problems:?}");
        assert!(paths.contains(&"server.max_body_size"), "{problems:?}");
        assert!(paths.contains(&"extra"), "{problems:?}");
        let unknown = problems
            .iter()
            .find(|p| p.path == "listeners[0].colour")
            .unwrap();
        assert!(unknown.message.contains("colour"), "{unknown:?}");
    }

    #[test]
    fn syntax_errors_carry_a_line() {
        let (_, problems) = load("listeners:\n  - bind: [\n", &env);
        assert_eq!(problems.len(), 1);
        assert!(problems[0].line.is_some(), "{problems:?}");
    }
}
