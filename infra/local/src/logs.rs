//! CloudWatch Logs metric-filter patterns, the JSON subset the template's metric filters use, so
//! that tests can hold each alarm's filter to the log lines and events the code writes: a
//! pattern the template carries must parse here, and a line a code path logs must match the
//! filter its alarm counts.
//!
//! What it evaluates (CloudWatch Logs, "Filter and pattern syntax", the JSON forms;
//! infra/local/REALISM.md, "CloudWatch Logs metric filters"): `{ EXPR }`, where EXPR combines
//! comparisons with `&&` and `||` (`&&` binds tighter) and parentheses; a comparison is a
//! selector (`$`, then `.name` with names of letters, digits, `-` and `_`, and `[N]` array
//! indexes) followed by `= VALUE` or `!= VALUE` (a string, quoted or not, with a `*` wildcard at
//! its start or end, or `*` alone for any value; or a number), a numeric comparison (`<`, `>`,
//! `<=`, `>=` with a number), `IS TRUE`, `IS FALSE`, `IS NULL` or `NOT EXISTS`. Anything else
//! (text terms, space-delimited `[...]` patterns, regular expressions, other selector forms) is
//! refused with an error naming where: a filter this evaluator cannot read is a filter no test
//! can vouch for.

use serde_json::Value;

/// A pattern this evaluator refuses: what, and at which byte of the pattern.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("filter pattern {pattern:?}, at byte {at}: {message}")]
pub struct PatternError {
    pub pattern: String,
    pub at: usize,
    pub message: String,
}

/// Whether `event` (a log event's message, parsed as JSON) matches `pattern`.
pub fn matches(pattern: &str, event: &Value) -> Result<bool, PatternError> {
    Ok(parse(pattern)?.matches(event))
}

/// Whether the log message `message` matches `pattern`: a message that is not JSON matches no
/// JSON pattern.
pub fn matches_message(pattern: &str, message: &str) -> Result<bool, PatternError> {
    let parsed = parse(pattern)?;
    Ok(serde_json::from_str::<Value>(message).is_ok_and(|v| parsed.matches(&v)))
}

/// A parsed pattern, to match many events.
#[derive(Debug, Clone, PartialEq)]
pub struct Pattern(Expr);

impl Pattern {
    pub fn matches(&self, event: &Value) -> bool {
        self.0.eval(event)
    }
}

/// Parses `pattern`, or says why it is outside the subset.
pub fn parse(pattern: &str) -> Result<Pattern, PatternError> {
    let mut p = Parser {
        text: pattern,
        at: 0,
    };
    p.skip_ws();
    if !p.eat("{") {
        return Err(p.error(
            "only JSON patterns ({ ... }) are evaluated; text terms and space-delimited [...] \
             patterns are not",
        ));
    }
    let expr = p.or()?;
    p.skip_ws();
    if !p.eat("}") {
        return Err(p.error("expected `&&`, `||` or the closing `}`"));
    }
    p.skip_ws();
    if p.at != p.text.len() {
        return Err(p.error("text after the closing `}`"));
    }
    Ok(Pattern(expr))
}

#[derive(Debug, Clone, PartialEq)]
enum Expr {
    Or(Vec<Expr>),
    And(Vec<Expr>),
    Test(Selector, Test),
}

/// One step of a selector: a property or an array index.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    Key(String),
    Index(usize),
}

type Selector = Vec<Step>;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Eq,
    Ne,
    Lt,
    Gt,
    Le,
    Ge,
}

#[derive(Debug, Clone, PartialEq)]
enum Literal {
    /// A string; `*` at its start or end is a wildcard (`*` alone: any string or number).
    Text(String),
    Number(f64),
}

#[derive(Debug, Clone, PartialEq)]
enum Test {
    Compare(Op, Literal),
    IsTrue,
    IsFalse,
    IsNull,
    NotExists,
}

impl Expr {
    fn eval(&self, event: &Value) -> bool {
        match self {
            Expr::Or(all) => all.iter().any(|e| e.eval(event)),
            Expr::And(all) => all.iter().all(|e| e.eval(event)),
            Expr::Test(selector, test) => {
                let node = select(event, selector);
                match test {
                    Test::NotExists => node.is_none(),
                    Test::IsNull => node.is_some_and(Value::is_null),
                    Test::IsTrue => node == Some(&Value::Bool(true)),
                    Test::IsFalse => node == Some(&Value::Bool(false)),
                    // A comparison applies to a value node (a string or a number) only: on a
                    // missing property, null, a boolean, an array or an object, `=` and `!=`
                    // both fail.
                    Test::Compare(op, literal) => node.is_some_and(|n| compare(n, *op, literal)),
                }
            }
        }
    }
}

fn select<'a>(event: &'a Value, selector: &[Step]) -> Option<&'a Value> {
    selector.iter().try_fold(event, |node, step| match step {
        Step::Key(k) => node.as_object()?.get(k),
        Step::Index(i) => node.as_array()?.get(*i),
    })
}

fn compare(node: &Value, op: Op, literal: &Literal) -> bool {
    match (literal, node) {
        (Literal::Text(t), Value::Number(_)) if t == "*" => op == Op::Eq,
        (Literal::Text(pattern), Value::String(s)) => {
            let hit = wildcard(pattern, s);
            match op {
                Op::Eq => hit,
                Op::Ne => !hit,
                _ => false,
            }
        }
        (Literal::Number(want), Value::Number(n)) => {
            let Some(n) = n.as_f64() else { return false };
            match op {
                Op::Eq => n == *want,
                Op::Ne => n != *want,
                Op::Lt => n < *want,
                Op::Gt => n > *want,
                Op::Le => n <= *want,
                Op::Ge => n >= *want,
            }
        }
        // A number against a string node, or a string against a number: no match (the
        // documentation is silent; see REALISM.md).
        _ => false,
    }
}

/// `*x`, `x*`, `*x*` and `*`; a `*` inside the text is the character itself.
fn wildcard(pattern: &str, s: &str) -> bool {
    if pattern == "*" {
        return true;
    }
    let (lead, rest) = match pattern.strip_prefix('*') {
        Some(r) => (true, r),
        None => (false, pattern),
    };
    let (trail, core) = match rest.strip_suffix('*') {
        Some(c) => (true, c),
        None => (false, rest),
    };
    match (lead, trail) {
        (false, false) => s == core,
        (true, false) => s.ends_with(core),
        (false, true) => s.starts_with(core),
        (true, true) => s.contains(core),
    }
}

struct Parser<'a> {
    text: &'a str,
    at: usize,
}

impl Parser<'_> {
    fn error(&self, message: &str) -> PatternError {
        PatternError {
            pattern: self.text.to_string(),
            at: self.at,
            message: message.to_string(),
        }
    }

    fn rest(&self) -> &str {
        &self.text[self.at..]
    }

    fn skip_ws(&mut self) {
        let trimmed = self.rest().trim_start();
        self.at = self.text.len() - trimmed.len();
    }

    fn eat(&mut self, token: &str) -> bool {
        if self.rest().starts_with(token) {
            self.at += token.len();
            true
        } else {
            false
        }
    }

    fn or(&mut self) -> Result<Expr, PatternError> {
        let mut all = vec![self.and()?];
        loop {
            self.skip_ws();
            if !self.eat("||") {
                break;
            }
            all.push(self.and()?);
        }
        Ok(if all.len() == 1 {
            all.remove(0)
        } else {
            Expr::Or(all)
        })
    }

    fn and(&mut self) -> Result<Expr, PatternError> {
        let mut all = vec![self.unary()?];
        loop {
            self.skip_ws();
            if !self.eat("&&") {
                break;
            }
            all.push(self.unary()?);
        }
        Ok(if all.len() == 1 {
            all.remove(0)
        } else {
            Expr::And(all)
        })
    }

    fn unary(&mut self) -> Result<Expr, PatternError> {
        self.skip_ws();
        if self.eat("(") {
            let inner = self.or()?;
            self.skip_ws();
            if !self.eat(")") {
                return Err(self.error("expected `)`"));
            }
            return Ok(inner);
        }
        let selector = self.selector()?;
        self.skip_ws();
        let test = self.test()?;
        Ok(Expr::Test(selector, test))
    }

    fn selector(&mut self) -> Result<Selector, PatternError> {
        if !self.eat("$") {
            return Err(self.error("expected a selector starting with `$`"));
        }
        let mut steps = Vec::new();
        loop {
            if self.eat(".") {
                let name: String = self
                    .rest()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
                    .collect();
                if name.is_empty() {
                    return Err(self.error(
                        "a property name is letters, digits, `-` and `_` (other selector forms, \
                         such as $.['name'], are not evaluated)",
                    ));
                }
                self.at += name.len();
                steps.push(Step::Key(name));
            } else if self.eat("[") {
                if steps.is_empty() {
                    return Err(self.error("an array index must follow a property"));
                }
                let digits: String = self
                    .rest()
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                let Ok(index) = digits.parse::<usize>() else {
                    return Err(self.error("an array index is a number: [N]"));
                };
                self.at += digits.len();
                if !self.eat("]") {
                    return Err(self.error("expected `]`"));
                }
                steps.push(Step::Index(index));
            } else {
                break;
            }
        }
        if steps.is_empty() {
            return Err(self.error("a selector names a property: $.name"));
        }
        Ok(steps)
    }

    fn test(&mut self) -> Result<Test, PatternError> {
        for (word, test) in [
            ("IS TRUE", Test::IsTrue),
            ("IS FALSE", Test::IsFalse),
            ("IS NULL", Test::IsNull),
            ("NOT EXISTS", Test::NotExists),
        ] {
            if self.eat(word) {
                return Ok(test);
            }
        }
        let op = if self.eat("!=") {
            Op::Ne
        } else if self.eat("<=") {
            Op::Le
        } else if self.eat(">=") {
            Op::Ge
        } else if self.eat("=") {
            Op::Eq
        } else if self.eat("<") {
            Op::Lt
        } else if self.eat(">") {
            Op::Gt
        } else {
            return Err(self
                .error("expected =, !=, <, >, <=, >=, IS TRUE, IS FALSE, IS NULL or NOT EXISTS"));
        };
        self.skip_ws();
        let literal = self.literal()?;
        if !matches!(op, Op::Eq | Op::Ne) && !matches!(literal, Literal::Number(_)) {
            return Err(self.error("<, >, <= and >= compare with a number"));
        }
        Ok(Test::Compare(op, literal))
    }

    fn literal(&mut self) -> Result<Literal, PatternError> {
        if self.eat("\"") {
            let mut out = String::new();
            let mut chars = self.rest().char_indices();
            loop {
                match chars.next() {
                    None => return Err(self.error("unterminated string")),
                    Some((i, '"')) => {
                        self.at += i + 1;
                        return Ok(Literal::Text(out));
                    }
                    Some((_, '\\')) => match chars.next() {
                        Some((_, c)) => out.push(c),
                        None => return Err(self.error("unterminated string")),
                    },
                    Some((_, c)) => out.push(c),
                }
            }
        }
        if self.rest().starts_with('%') {
            return Err(self.error("regular expressions (%...%) are not evaluated"));
        }
        let token: String = self
            .rest()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '*' | '_' | '-' | '+'))
            .collect();
        if token.is_empty() {
            return Err(self.error(
                "expected a value: a number, a quoted string, or letters and digits (with . * _ -)",
            ));
        }
        self.at += token.len();
        Ok(match number(&token) {
            Some(n) => Literal::Number(n),
            None => Literal::Text(token),
        })
    }
}

/// The documentation's NUMBER: an integer or a decimal with an optional sign, optionally
/// followed by `e` and a signed integer.
fn number(token: &str) -> Option<f64> {
    let unsigned = token.strip_prefix(['+', '-']).unwrap_or(token);
    let (mantissa, exponent) = match unsigned.split_once(['e', 'E']) {
        Some((m, e)) => (m, Some(e)),
        None => (unsigned, None),
    };
    let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    let mantissa_ok = match mantissa.split_once('.') {
        Some((int, frac)) => digits(int) && digits(frac),
        None => digits(mantissa),
    };
    let exponent_ok = exponent.is_none_or(|e| digits(e.strip_prefix(['+', '-']).unwrap_or(e)));
    if mantissa_ok && exponent_ok {
        token.parse().ok()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn reserved() -> Value {
        json!({"version": "0", "source": "capacity-pilot", "detail-type": "Capacity Reserved",
               "detail": {"request_id": "r-1", "late": false, "count": 4, "ids": ["cr-1"]}})
    }

    #[test]
    fn the_templates_forms_match_as_written() {
        let e = reserved();
        assert!(matches(r#"{ $.detail-type = "Capacity Reserved" }"#, &e).unwrap());
        assert!(!matches(r#"{ $.detail-type = "Capacity Payment Failed" }"#, &e).unwrap());
        assert!(matches(r#"{ $.detail.late IS FALSE }"#, &e).unwrap());
        assert!(!matches(r#"{ $.detail.late IS TRUE }"#, &e).unwrap());
        assert!(
            matches(
                r#"{ ($.detail-type = "Capacity Reserved") && ($.detail.late IS FALSE) }"#,
                &e
            )
            .unwrap()
        );
        let line = json!({"level": "WARN", "fields": {"alert": "request-overdue"}});
        assert!(matches(r#"{ $.fields.alert = "request-overdue" }"#, &line).unwrap());
        assert!(!matches(r#"{ $.fields.alert = "request-overdue" }"#, &e).unwrap());
    }

    #[test]
    fn wildcards_sit_at_the_ends_only() {
        let e = reserved();
        assert!(matches(r#"{ $.detail-type = "Capacity*" }"#, &e).unwrap());
        assert!(matches(r#"{ $.detail-type = "*Reserved" }"#, &e).unwrap());
        assert!(matches(r#"{ $.detail-type = "*city Res*" }"#, &e).unwrap());
        assert!(!matches(r#"{ $.detail-type = "Capacity*Reserved" }"#, &e).unwrap());
        assert!(matches(r#"{ $.detail.count = * }"#, &e).unwrap());
        assert!(matches(r#"{ $.detail.request_id = * }"#, &e).unwrap());
        assert!(!matches(r#"{ $.detail.missing = * }"#, &e).unwrap());
    }

    #[test]
    fn comparisons_apply_to_value_nodes_only() {
        let e = reserved();
        assert!(!matches(r#"{ $.detail.missing != "x" }"#, &e).unwrap());
        assert!(!matches(r#"{ $.detail.ids = "cr-1" }"#, &e).unwrap());
        assert!(!matches(r#"{ $.detail.ids != "cr-1" }"#, &e).unwrap());
        assert!(matches(r#"{ $.detail.ids[0] = "cr-1" }"#, &e).unwrap());
        assert!(matches(r#"{ $.detail.count >= 4 && $.detail.count < 5 }"#, &e).unwrap());
        assert!(!matches(r#"{ $.detail.count = "4" }"#, &e).unwrap());
        assert!(matches(r#"{ $.detail.missing NOT EXISTS }"#, &e).unwrap());
        assert!(!matches(r#"{ $.detail.late NOT EXISTS }"#, &e).unwrap());
    }

    #[test]
    fn patterns_outside_the_subset_are_refused_saying_where() {
        for bad in [
            "ERROR",
            "[ip, user, status_code = 4*]",
            r#"{ $.['detail-type'] = "x" }"#,
            r#"{ $.a = %regex% }"#,
            r#"{ $.a > "x" }"#,
            r#"{ $.a is true }"#,
            r#"{ $.a = "x" "#,
            r#"{ $.a = "x" } trailing"#,
            r#"{ $[0] = 1 }"#,
            r#"{ $.a = x y }"#,
        ] {
            let e = parse(bad).expect_err(bad);
            assert!(e.at <= bad.len(), "{e}");
            assert_eq!(e.pattern, bad, "{e}");
        }
    }

    #[test]
    fn a_message_that_is_not_json_matches_nothing() {
        assert!(!matches_message(r#"{ $.a = "x" }"#, "plain text").unwrap());
        assert!(matches_message(r#"{ $.a = "x" }"#, r#"{"a":"x"}"#).unwrap());
        assert!(matches_message("not a pattern", "{}").is_err());
    }
}
