//! OpenSSH's absolute time format (`YYYYMMDD[HHMM[SS]]Z`) and Unix seconds.
//!
//! Only UTC times (trailing `Z`) are accepted: OpenSSH reads a time without `Z` in the local
//! time zone of whoever checks it, which would make a host's verdict depend on its time zone.

use thiserror::Error;

/// Why a time string was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TimeError {
    #[error("{0:?} is not a time of the form YYYYMMDD[HHMM[SS]]Z")]
    Shape(String),
    #[error(
        "{0:?} has no trailing Z; write times in UTC (OpenSSH reads them as local time otherwise)"
    )]
    NotUtc(String),
    #[error("{0:?} names a date or time that does not exist")]
    OutOfRange(String),
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap(year) => 29,
        _ => 28,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Parses `YYYYMMDD[HHMM[SS]]Z` into Unix seconds.
pub fn parse_ssh_time(text: &str) -> Result<u64, TimeError> {
    let digits = match text.strip_suffix('Z').or_else(|| text.strip_suffix('z')) {
        Some(d) => d,
        None if text.bytes().all(|b| b.is_ascii_digit()) && matches!(text.len(), 8 | 12 | 14) => {
            return Err(TimeError::NotUtc(text.to_owned()));
        }
        None => return Err(TimeError::Shape(text.to_owned())),
    };
    if !digits.bytes().all(|b| b.is_ascii_digit()) || !matches!(digits.len(), 8 | 12 | 14) {
        return Err(TimeError::Shape(text.to_owned()));
    }
    let num = |range: std::ops::Range<usize>| -> u32 {
        digits[range]
            .bytes()
            .fold(0u32, |acc, b| acc * 10 + u32::from(b - b'0'))
    };
    let year = i64::from(num(0..4));
    let month = num(4..6);
    let day = num(6..8);
    let (hour, minute, second) = match digits.len() {
        8 => (0, 0, 0),
        12 => (num(8..10), num(10..12), 0),
        _ => (num(8..10), num(10..12), num(12..14)),
    };
    if year < 1970
        || !(1..=12).contains(&month)
        || day == 0
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 59
    {
        return Err(TimeError::OutOfRange(text.to_owned()));
    }
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + i64::from(hour) * 3600 + i64::from(minute) * 60 + i64::from(second);
    u64::try_from(secs).map_err(|_| TimeError::OutOfRange(text.to_owned()))
}

/// Unix seconds as UTC year, month, day, hour, minute and second.
fn civil_from_unix(unix: u64) -> (i64, u32, u32, u64, u64, u64) {
    let (y, m, d) = civil_from_days((unix / 86_400) as i64);
    let rem = unix % 86_400;
    (y, m, d, rem / 3600, (rem % 3600) / 60, rem % 60)
}

/// Formats Unix seconds as `YYYYMMDDHHMMSSZ`, the form `ssh-keygen -Overify-time=` takes.
pub fn format_ssh_time(unix: u64) -> String {
    let (y, m, d, h, mi, s) = civil_from_unix(unix);
    format!("{y:04}{m:02}{d:02}{h:02}{mi:02}{s:02}Z")
}

/// Formats microseconds since the Unix epoch as RFC 3339 in UTC with all six decimals
/// (`2026-12-01T13:20:41.123456Z`): journald keeps microseconds, and so does every log
/// timestamp clawfleet shows.
pub fn format_rfc3339_micros(unix_micros: u64) -> String {
    let micros = unix_micros % 1_000_000;
    let (y, m, d, h, mi, s) = civil_from_unix(unix_micros / 1_000_000);
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{micros:06}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_keeps_microseconds_in_utc() {
        assert_eq!(format_rfc3339_micros(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            format_rfc3339_micros((1_767_225_600 + 3723) * 1_000_000 + 42),
            "2026-01-01T01:02:03.000042Z"
        );
    }

    #[test]
    fn parses_the_three_lengths() {
        assert_eq!(parse_ssh_time("19700101Z"), Ok(0));
        assert_eq!(parse_ssh_time("20260101Z"), Ok(1_767_225_600));
        assert_eq!(parse_ssh_time("202601010102Z"), Ok(1_767_225_600 + 3720));
        assert_eq!(parse_ssh_time("20260101010203z"), Ok(1_767_225_600 + 3723));
        assert_eq!(parse_ssh_time("20240229Z"), Ok(1_709_164_800));
    }

    #[test]
    fn refuses_local_times_and_nonsense() {
        assert!(matches!(
            parse_ssh_time("20260101"),
            Err(TimeError::NotUtc(_))
        ));
        assert!(matches!(
            parse_ssh_time("2026010Z"),
            Err(TimeError::Shape(_))
        ));
        assert!(matches!(
            parse_ssh_time("2026-01-01Z"),
            Err(TimeError::Shape(_))
        ));
        assert!(matches!(
            parse_ssh_time("20250229Z"),
            Err(TimeError::OutOfRange(_))
        ));
        assert!(matches!(
            parse_ssh_time("20261301Z"),
            Err(TimeError::OutOfRange(_))
        ));
        assert!(matches!(
            parse_ssh_time("202601012400Z"),
            Err(TimeError::OutOfRange(_))
        ));
        assert!(matches!(parse_ssh_time(""), Err(TimeError::Shape(_))));
    }

    #[test]
    fn format_round_trips() {
        for t in [
            0u64,
            1,
            86_399,
            951_782_400,
            1_767_225_600 + 3723,
            4_102_444_799,
        ] {
            assert_eq!(parse_ssh_time(&format_ssh_time(t)), Ok(t), "{t}");
        }
    }
}
