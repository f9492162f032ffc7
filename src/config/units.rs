//! Parsers for the human-written units in the YAML file: durations (`250ms`,
//! `30s`, `1m`, `1h`, `1d`) and sizes (`512`, `16KB`, `1MB`, `1GiB`).
//!
//! Sizes follow nginx: `K`/`KB`/`KiB` are all 1024 bytes, so `zone=10m` and
//! `size: 10MB` mean the same amount of memory. Every parser returns the
//! message that validation prints after the YAML path.

use std::time::Duration;

/// Parses `<number><unit>` with unit `ms`, `s`, `m`, `h` or `d`; several parts
/// may follow each other (`1m30s`). A bare number is refused on purpose: `60`
/// could be seconds or milliseconds, and guessing wrong is an outage.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("expected a duration like \"250ms\", \"30s\" or \"1m\", got \"{text}\"");
    let s = text.trim();
    if s.is_empty() {
        return Err(bad());
    }
    let mut total_ms: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(bad());
        }
        let value: u128 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit_ms: u128 = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(bad()),
        };
        rest = &rest[unit_len..];
        total_ms = total_ms.saturating_add(value.saturating_mul(unit_ms));
    }
    let ms = u64::try_from(total_ms).map_err(|_| bad())?;
    Ok(Duration::from_millis(ms))
}

/// Parses a byte size: a bare number of bytes, or a number with `K`, `M`, `G`
/// (optionally followed by `B` or `iB`), case-insensitive, 1024-based.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let bad = || format!("expected a size like \"16KB\" or \"10MB\", got \"{text}\"");
    let s = text.trim();
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err(bad());
    }
    let value: u64 = s[..digits].parse().map_err(|_| bad())?;
    let unit = s[digits..].trim().to_ascii_lowercase();
    let multiplier: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return Err(bad()),
    };
    value.checked_mul(multiplier).ok_or_else(bad)
}

/// Renders a duration the way a user would write it, for `tollgate check`.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        0 => "0s".to_owned(),
        _ if ms.is_multiple_of(3_600_000) => format!("{}h", ms / 3_600_000),
        _ if ms.is_multiple_of(60_000) => format!("{}m", ms / 60_000),
        _ if ms.is_multiple_of(1_000) => format!("{}s", ms / 1_000),
        _ => format!("{ms}ms"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_in_every_unit() {
        let cases = [
            ("250ms", 250),
            ("30s", 30_000),
            ("1m", 60_000),
            ("1m30s", 90_000),
            ("2h", 7_200_000),
            ("1d", 86_400_000),
            (" 5s ", 5_000),
            ("0s", 0),
        ];
        for (text, ms) in cases {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_millis(ms)),
                "{text}"
            );
        }
    }

    #[test]
    fn durations_without_a_unit_or_with_a_bad_one_are_refused() {
        for text in ["60", "", "s", "1.5s", "10 sec", "-1s", "1m x"] {
            let err = parse_duration(text).unwrap_err();
            assert!(err.contains(&format!("got \"{text}\"")), "{err}");
        }
    }

    #[test]
    fn sizes_are_1024_based_like_nginx() {
        let cases = [
            ("512", 512),
            ("16KB", 16 << 10),
            ("16k", 16 << 10),
            ("10MB", 10 << 20),
            ("10m", 10 << 20),
            ("1GiB", 1 << 30),
            ("7b", 7),
        ];
        for (text, bytes) in cases {
            assert_eq!(parse_size(text), Ok(bytes), "{text}");
        }
        for text in ["", "MB", "1.5MB", "10TB", "-1"] {
            assert!(parse_size(text).is_err(), "{text}");
        }
    }

    #[test]
    fn formatting_round_trips() {
        for text in ["250ms", "30s", "1m", "2h"] {
            assert_eq!(format_duration(parse_duration(text).unwrap()), text);
        }
    }
}
