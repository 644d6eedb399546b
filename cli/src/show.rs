//! How results are shown: a table (or a short text) on a terminal, JSON when piped or asked
//! (`--output`); colour only on a terminal and never with `NO_COLOR`; progress on stderr.

use std::io::IsTerminal;

use capacity_pilot::domain::money::{MicroUsd, Usd};
use capacity_pilot::domain::status::RequestStatus;
use chrono::{DateTime, Utc};
use comfy_table::{Attribute, Cell, Color, ContentArrangement, Table, presets};
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
}

/// Where and how a command writes.
#[derive(Debug, Clone, Copy)]
pub struct Out {
    pub format: Format,
    pub colour: bool,
    /// stderr is a terminal: progress may be drawn there.
    pub progress: bool,
    /// stdin is a terminal: a command may ask.
    pub interactive: bool,
}

impl Out {
    pub fn new(format: Option<Format>) -> Out {
        let tty = std::io::stdout().is_terminal();
        let format = format.unwrap_or(if tty { Format::Table } else { Format::Json });
        let no_colour = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Out {
            format,
            colour: tty && !no_colour && format == Format::Table,
            progress: std::io::stderr().is_terminal(),
            interactive: std::io::stdin().is_terminal(),
        }
    }

    pub fn json(&self) -> bool {
        self.format == Format::Json
    }

    /// Prints `v` as indented JSON.
    pub fn print_json(&self, v: &Value) {
        println!(
            "{}",
            serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
        );
    }

    /// A table with `headers`, borderless like kubectl's.
    pub fn table(&self, headers: &[&str]) -> Table {
        let mut t = Table::new();
        t.load_preset(presets::NOTHING)
            .set_content_arrangement(ContentArrangement::Dynamic);
        if !self.colour {
            t.force_no_tty();
        }
        t.set_header(headers.iter().map(|h| {
            let c = Cell::new(h);
            if self.colour {
                c.add_attribute(Attribute::Bold)
            } else {
                c
            }
        }));
        t
    }

    /// A line of progress on stderr, only on a terminal.
    pub fn progress_line(&self, line: &str) {
        if self.progress {
            eprintln!("{line}");
        }
    }

    /// A two-column list of fields, without a header.
    pub fn fields(&self) -> Table {
        let mut t = Table::new();
        t.load_preset(presets::NOTHING)
            .set_content_arrangement(ContentArrangement::Dynamic);
        if !self.colour {
            t.force_no_tty();
        }
        t
    }

    /// Prints a table flush left, columns two spaces apart, and no padding after the last.
    pub fn print_table(&self, t: &mut Table) {
        for c in t.column_iter_mut() {
            c.set_padding((0, 2));
        }
        for line in t.lines() {
            println!("{}", line.trim_end());
        }
    }

    /// Something a person should not miss (a pause), yellow on a terminal.
    pub fn warn(&self, text: impl Into<String>) -> Cell {
        let c = Cell::new(text.into());
        if self.colour { c.fg(Color::Yellow) } else { c }
    }

    /// A status, coloured by what it means on a terminal.
    pub fn status(&self, s: RequestStatus) -> Cell {
        let c = Cell::new(s.as_str());
        if !self.colour {
            return c;
        }
        use RequestStatus::*;
        match s {
            Failed | Rejected => c.fg(Color::Red),
            Cancelled | Ended => c.fg(Color::DarkGrey),
            AwaitingApproval | NotFound => c.fg(Color::Yellow),
            Reserved | Active | RunningOnDemand | RunningSpot => c.fg(Color::Green),
            _ => c,
        }
    }
}

/// `text` as lines of at most 90 columns, broken between words.
pub fn paragraph(text: &str) -> String {
    wrap(text, 90).join("\n")
}

/// `prefix` then `text`, its lines after the first indented under the text, within 100
/// columns.
pub fn hanging(prefix: &str, text: &str) -> String {
    let indent = " ".repeat(prefix.chars().count());
    let width = 100usize.saturating_sub(indent.len()).max(40);
    wrap(text, width)
        .iter()
        .enumerate()
        .map(|(i, l)| format!("{}{l}", if i == 0 { prefix } else { &indent }))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `text` as lines of at most `width` columns, broken between words.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            out.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    out.push(line);
    out
}

/// `2026-12-07 11:30 UTC`.
pub fn when(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M UTC").to_string()
}

pub fn when_opt(t: Option<DateTime<Utc>>) -> String {
    t.map(when).unwrap_or_else(|| "-".into())
}

/// `$12,345.67`.
pub fn usd(u: Usd) -> String {
    let s = format!("{:.2}", u.amount().round_dp(2));
    let (whole, cents) = s.split_once('.').unwrap_or((&s, "00"));
    let (sign, digits) = whole.strip_prefix('-').map_or(("", whole), |d| ("-", d));
    let mut grouped = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(c);
    }
    format!("{sign}${grouped}.{cents}")
}

pub fn micro(m: MicroUsd) -> String {
    usd(m.to_usd())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_paragraph_breaks_between_words_within_90_columns() {
        let text = "word ".repeat(40);
        let p = paragraph(&text);
        assert!(p.lines().all(|l| l.len() <= 90 && !l.ends_with(' ')), "{p}");
        assert_eq!(p.split_whitespace().count(), 40);
    }

    #[test]
    fn a_hanging_paragraph_indents_its_later_lines_under_its_text() {
        let h = hanging("09:00  Accepted  ", &"word ".repeat(40));
        let lines: Vec<&str> = h.lines().collect();
        assert!(lines[0].starts_with("09:00  Accepted  word"));
        assert!(
            lines[1..]
                .iter()
                .all(|l| l.starts_with(&" ".repeat(17)) && l.len() <= 100)
        );
    }

    #[test]
    fn dollars_are_grouped_in_thousands_with_cents() {
        assert_eq!(usd(Usd::parse("1234567.891").unwrap()), "$1,234,567.89");
        assert_eq!(usd(Usd::parse("5").unwrap()), "$5.00");
        assert_eq!(usd(Usd::parse("-1000").unwrap()), "-$1,000.00");
        assert_eq!(usd(Usd::parse("999.999").unwrap()), "$1,000.00");
    }
}
