//! Dates in the admin panel: publication times are UTC timestamps written exactly as
//! `YYYY-MM-DDTHH:MM:SSZ` (so comparing two of them as strings compares them in time), and
//! day arithmetic on the proleptic Gregorian calendar. Also reads a date out of a sentence
//! ("schedule it for October 15", "move it to 20 Oct"), for the oracle.

const MONTHS: [&str; 12] = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
];

/// A calendar day.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Day {
    pub year: i64,
    pub month: u32,
    pub day: u32,
}

fn leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap(year) => 29,
        2 => 28,
        _ => 0,
    }
}

impl Day {
    pub fn new(year: i64, month: u32, day: u32) -> Option<Self> {
        ((1..=12).contains(&month) && day >= 1 && day <= days_in_month(year, month))
            .then_some(Self { year, month, day })
    }

    /// Days since 1970-01-01.
    pub fn to_days(self) -> i64 {
        let y = if self.month <= 2 {
            self.year - 1
        } else {
            self.year
        };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let m = i64::from(self.month);
        let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(self.day) - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        era * 146_097 + doe - 719_468
    }

    /// The day `days` after 1970-01-01.
    pub fn from_days(days: i64) -> Self {
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        Self { year, month, day }
    }

    pub fn plus_days(self, days: i64) -> Self {
        Self::from_days(self.to_days() + days)
    }

    /// `YYYY-MM-DDT<time>Z`.
    pub fn at(self, time: &str) -> String {
        format!("{:04}-{:02}-{:02}T{time}Z", self.year, self.month, self.day)
    }
}

/// Checks a publication time: `Ok(day)` when it is a real UTC time written
/// `YYYY-MM-DDTHH:MM:SSZ`, else what is wrong with it.
pub fn parse_timestamp(text: &str) -> Result<Day, String> {
    let bytes = text.as_bytes();
    let shape_ok = bytes.len() == 20
        && bytes.iter().enumerate().all(|(i, b)| match i {
            4 | 7 => *b == b'-',
            10 => *b == b'T',
            13 | 16 => *b == b':',
            19 => *b == b'Z',
            _ => b.is_ascii_digit(),
        });
    if !shape_ok {
        return Err(format!(
            "`{text}` is not a UTC time written YYYY-MM-DDTHH:MM:SSZ"
        ));
    }
    let number = |range: std::ops::Range<usize>| -> u32 {
        text.get(range)
            .and_then(|s| s.parse().ok())
            .unwrap_or(u32::MAX)
    };
    let day = Day::new(i64::from(number(0..4)), number(5..7), number(8..10))
        .ok_or_else(|| format!("`{text}` names a day that does not exist"))?;
    if number(11..13) > 23 || number(14..16) > 59 || number(17..19) > 59 {
        return Err(format!("`{text}` names a time of day that does not exist"));
    }
    Ok(day)
}

/// A date named in `text` — "October 15", "Oct 15th", "15 October", "2026-10-15" — with the
/// byte range of the words that name it. Without a year, the first such day on or after
/// `today` is meant.
pub fn find_date(text: &str, today: Day) -> Option<(Day, std::ops::Range<usize>)> {
    let words: Vec<(usize, &str)> = word_spans(text);
    for (n, &(start, word)) in words.iter().enumerate() {
        if let Ok(day) = parse_timestamp(&format!("{word}T00:00:00Z")) {
            return Some((day, start..start + word.len()));
        }
        let Some(month) = month_of(word) else {
            continue;
        };
        // "October 15" / "October 15th", else "15 October".
        let after = words
            .get(n + 1)
            .and_then(|&(s, w)| Some((s, w, day_of(w)?)));
        let before = n
            .checked_sub(1)
            .and_then(|i| words.get(i))
            .and_then(|&(s, w)| Some((s, w, day_of(w)?)));
        let (span, day) = match (after, before) {
            (Some((s, w, d)), _) => (start..s + w.len(), d),
            (None, Some((s, _, d))) => (s..start + word.len(), d),
            (None, None) => continue,
        };
        let this_year = Day::new(today.year, month, day);
        let chosen = match this_year {
            Some(d) if d >= today => Some(d),
            _ => Day::new(today.year + 1, month, day),
        };
        if let Some(chosen) = chosen {
            return Some((chosen, span));
        }
    }
    None
}

/// Words of `text` (letters, digits and hyphens) with their byte offsets.
fn word_spans(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        let inside = c.is_alphanumeric() || c == '-';
        match (inside, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push((s, &text[s..i]));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, &text[s..]));
    }
    out
}

fn month_of(word: &str) -> Option<u32> {
    let word = word.to_lowercase();
    if word.len() < 3 {
        return None;
    }
    MONTHS
        .iter()
        .position(|m| {
            m.starts_with(&word) && (word.len() == 3 || word.len() == m.len())
                || (word == "sept" && *m == "september")
        })
        .map(|i| i as u32 + 1)
}

fn day_of(word: &str) -> Option<u32> {
    let digits = word.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let suffix = &word[digits.len()..];
    if !matches!(suffix, "" | "st" | "nd" | "rd" | "th") || digits.is_empty() || digits.len() > 2 {
        return None;
    }
    digits.parse().ok().filter(|d| (1..=31).contains(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_round_trip_across_leap_years_and_eras() {
        for days in (-800_000..800_000).step_by(997) {
            assert_eq!(Day::from_days(days).to_days(), days);
        }
        assert_eq!(Day::new(1970, 1, 1).unwrap().to_days(), 0);
        assert_eq!(
            Day::new(2028, 2, 28).unwrap().plus_days(1),
            Day::new(2028, 2, 29).unwrap()
        );
        assert_eq!(
            Day::new(2026, 12, 31).unwrap().plus_days(1),
            Day::new(2027, 1, 1).unwrap()
        );
        assert!(Day::new(2026, 2, 29).is_none());
    }

    #[test]
    fn timestamps_are_checked_for_shape_and_calendar() {
        assert_eq!(
            parse_timestamp("2026-10-15T09:00:00Z"),
            Ok(Day::new(2026, 10, 15).unwrap())
        );
        for bad in [
            "2026-10-15",
            "2026-10-15T09:00:00",
            "2026-10-15 09:00:00Z",
            "2026-13-01T09:00:00Z",
            "2026-02-30T09:00:00Z",
            "2026-10-15T24:00:00Z",
            "2026-10-15T09:60:00Z",
        ] {
            assert!(parse_timestamp(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn dates_are_found_in_sentences() {
        let today = Day::new(2026, 10, 1).unwrap();
        let text =
            "Prepare a post about the launch of the new product and schedule it for October 15";
        let (day, span) = find_date(text, today).unwrap();
        assert_eq!(day, Day::new(2026, 10, 15).unwrap());
        assert_eq!(&text[span], "October 15");
        let text = "Let's move the publication to October 20";
        assert_eq!(
            find_date(text, today).unwrap().0,
            Day::new(2026, 10, 20).unwrap()
        );
        let text = "make it the 3rd of Nov, please";
        assert!(find_date(text, today).is_none(), "'of' stands between them");
        let text = "make it 3rd Nov";
        assert_eq!(
            find_date(text, today).unwrap().0,
            Day::new(2026, 11, 3).unwrap()
        );
        // A day already past this year is next year's.
        let text = "publish on Sept 9th";
        assert_eq!(
            find_date(text, today).unwrap().0,
            Day::new(2027, 9, 9).unwrap()
        );
        let text = "go live 2026-12-01 instead";
        let (day, span) = find_date(text, today).unwrap();
        assert_eq!(day, Day::new(2026, 12, 1).unwrap());
        assert_eq!(&text[span], "2026-12-01");
        assert!(find_date("no date here, may be later", today).is_none());
        assert!(find_date("February 30", today).is_none());
    }
}
