//! The calculator tool: exact arithmetic a harness may offer its model.
//!
//! Small models make arithmetic slips; a calculator removes that failure so the policy can
//! learn to decompose problems. It evaluates `+ - * / ^`, parentheses, unary signs and
//! decimals over exact rationals with a hand-written recursive-descent parser, and refuses
//! everything else (names, unbalanced parentheses, division by zero, huge powers, overlong
//! input) with an error that names the position, so the model can correct its call.

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{One, Signed, ToPrimitive, Zero};
use std::fmt;

/// Longest accepted expression, in characters.
pub const MAX_EXPRESSION_CHARS: usize = 1_000;
/// Largest accepted exponent in absolute value.
pub const MAX_EXPONENT: u32 = 1_000;
/// Largest accepted result, numerator and denominator bits together.
pub const MAX_RESULT_BITS: u64 = 10_000;
/// Deepest accepted nesting of parentheses and unary signs.
pub const MAX_NESTING: usize = 100;
/// Most significant digits [`CalcValue::approximate`] renders.
const MAX_SIGNIFICANT_DIGITS: usize = 100;
/// Significant digits of the decimal shown beside a fraction.
const APPROXIMATION_DIGITS: usize = 12;

/// Why an expression was refused. Positions are 0-based character offsets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CalcError {
    #[error("empty expression")]
    Empty,
    #[error("expression has {chars} characters; at most {max} are allowed")]
    TooLong { chars: usize, max: usize },
    #[error("unknown name `{name}` at position {pos}: only numbers, + - * / ^ and parentheses are allowed")]
    Name { pos: usize, name: String },
    #[error("unexpected character `{found}` at position {pos}")]
    UnexpectedChar { pos: usize, found: char },
    #[error("expected a number or `(` at position {pos}, found {found}")]
    ExpectedOperand { pos: usize, found: String },
    #[error("malformed number `{text}` at position {pos}")]
    MalformedNumber { pos: usize, text: String },
    #[error("`(` at position {pos} is never closed")]
    UnclosedParen { pos: usize },
    #[error("`)` at position {pos} has no matching `(`")]
    UnmatchedParen { pos: usize },
    #[error("division by zero at position {pos}")]
    DivisionByZero { pos: usize },
    #[error("the exponent of `^` at position {pos} is not an integer")]
    NonIntegerExponent { pos: usize },
    #[error("the exponent of `^` at position {pos} exceeds {max} in absolute value")]
    ExponentTooLarge { pos: usize, max: u32 },
    #[error("the result of the operation at position {pos} exceeds {max_bits} bits")]
    ResultTooLarge { pos: usize, max_bits: u64 },
    #[error("nesting deeper than {max} at position {pos}")]
    TooDeep { pos: usize, max: usize },
}

/// An exact result of [`calculate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CalcValue(pub BigRational);

impl CalcValue {
    /// A decimal rendering with `significant` digits, clamped to 1..=100 (positional, or
    /// scientific when very large or small).
    pub fn approximate(&self, significant: usize) -> String {
        approximate(&self.0, significant.clamp(1, MAX_SIGNIFICANT_DIGITS))
    }
}

/// An integer prints as itself; anything else as `a/b ≈ decimal`.
impl fmt::Display for CalcValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_integer() {
            write!(f, "{}", self.0.numer())
        } else {
            write!(f, "{}/{} ≈ {}", self.0.numer(), self.0.denom(), self.approximate(APPROXIMATION_DIGITS))
        }
    }
}

/// Evaluates an arithmetic expression exactly.
pub fn calculate(expression: &str) -> Result<CalcValue, CalcError> {
    let chars: Vec<char> = expression.chars().collect();
    if chars.len() > MAX_EXPRESSION_CHARS {
        return Err(CalcError::TooLong { chars: chars.len(), max: MAX_EXPRESSION_CHARS });
    }
    let mut parser = Parser { chars, pos: 0, depth: 0 };
    if parser.peek().is_none() {
        return Err(CalcError::Empty);
    }
    let value = parser.expression()?;
    match parser.peek() {
        None => Ok(CalcValue(value)),
        Some(')') => Err(CalcError::UnmatchedParen { pos: parser.pos }),
        Some(_) => Err(parser.unexpected()),
    }
}

/// `expression := term (('+'|'-') term)*`, `term := unary (('*'|'/') unary)*`,
/// `unary := ('-'|'+') unary | power`, `power := primary ('^' unary)?` (right-associative),
/// `primary := number | '(' expression ')'`.
struct Parser {
    chars: Vec<char>,
    pos: usize,
    depth: usize,
}

impl Parser {
    /// The next non-space character (the position is moved past spaces).
    fn peek(&mut self) -> Option<char> {
        while self.chars.get(self.pos).is_some_and(|c| c.is_whitespace()) {
            self.pos += 1;
        }
        self.chars.get(self.pos).copied()
    }

    fn descend(&mut self) -> Result<(), CalcError> {
        self.depth += 1;
        if self.depth > MAX_NESTING {
            return Err(CalcError::TooDeep { pos: self.pos, max: MAX_NESTING });
        }
        Ok(())
    }

    fn expression(&mut self) -> Result<BigRational, CalcError> {
        let mut value = self.term()?;
        while let Some(op @ ('+' | '-')) = self.peek() {
            let at = self.pos;
            self.pos += 1;
            let rhs = self.term()?;
            value = if op == '+' { value + rhs } else { value - rhs };
            check_size(&value, at)?;
        }
        Ok(value)
    }

    fn term(&mut self) -> Result<BigRational, CalcError> {
        let mut value = self.unary()?;
        while let Some(op @ ('*' | '/')) = self.peek() {
            let at = self.pos;
            self.pos += 1;
            let rhs = self.unary()?;
            value = if op == '*' {
                value * rhs
            } else if rhs.is_zero() {
                return Err(CalcError::DivisionByZero { pos: at });
            } else {
                value / rhs
            };
            check_size(&value, at)?;
        }
        Ok(value)
    }

    fn unary(&mut self) -> Result<BigRational, CalcError> {
        match self.peek() {
            Some(sign @ ('-' | '+')) => {
                self.pos += 1;
                self.descend()?;
                let operand = self.unary()?;
                self.depth -= 1;
                Ok(if sign == '-' { -operand } else { operand })
            }
            _ => self.power(),
        }
    }

    fn power(&mut self) -> Result<BigRational, CalcError> {
        let base = self.primary()?;
        if self.peek() != Some('^') {
            return Ok(base);
        }
        let at = self.pos;
        self.pos += 1;
        self.descend()?;
        let exponent = self.unary()?;
        self.depth -= 1;
        raise(&base, &exponent, at)
    }

    fn primary(&mut self) -> Result<BigRational, CalcError> {
        match self.peek() {
            Some(c) if c.is_ascii_digit() || c == '.' => self.number(),
            Some('(') => {
                let open = self.pos;
                self.pos += 1;
                self.descend()?;
                let value = self.expression()?;
                self.depth -= 1;
                if self.peek() != Some(')') {
                    return Err(match self.peek() {
                        None => CalcError::UnclosedParen { pos: open },
                        Some(_) => self.unexpected(),
                    });
                }
                self.pos += 1;
                Ok(value)
            }
            Some(c) if c.is_alphabetic() || c == '_' => Err(self.unexpected()),
            found => {
                let found = found.map_or("the end of the expression".to_string(), |c| format!("`{c}`"));
                Err(CalcError::ExpectedOperand { pos: self.pos, found })
            }
        }
    }

    fn number(&mut self) -> Result<BigRational, CalcError> {
        let start = self.pos;
        let len = self.chars[start..].iter().take_while(|c| c.is_ascii_digit() || **c == '.').count();
        self.pos += len;
        let text: String = self.chars[start..self.pos].iter().collect();
        parse_decimal(&text).ok_or(CalcError::MalformedNumber { pos: start, text })
    }

    /// The error for an unexpected character at the current position (a name, when letters).
    fn unexpected(&self) -> CalcError {
        let pos = self.pos;
        let name: String = self.chars[pos..].iter().take_while(|c| c.is_alphanumeric() || **c == '_').collect();
        match self.chars.get(pos) {
            Some(c) if c.is_alphabetic() || *c == '_' => CalcError::Name { pos, name },
            Some(&found) => CalcError::UnexpectedChar { pos, found },
            None => CalcError::ExpectedOperand { pos, found: "the end of the expression".into() },
        }
    }
}

fn check_size(value: &BigRational, pos: usize) -> Result<(), CalcError> {
    if value.numer().bits() + value.denom().bits() > MAX_RESULT_BITS {
        return Err(CalcError::ResultTooLarge { pos, max_bits: MAX_RESULT_BITS });
    }
    Ok(())
}

fn raise(base: &BigRational, exponent: &BigRational, pos: usize) -> Result<BigRational, CalcError> {
    if !exponent.is_integer() {
        return Err(CalcError::NonIntegerExponent { pos });
    }
    let magnitude = exponent
        .abs()
        .to_integer()
        .to_u32()
        .filter(|e| *e <= MAX_EXPONENT)
        .ok_or(CalcError::ExponentTooLarge { pos, max: MAX_EXPONENT })?;
    let base_bits = base.numer().bits().max(base.denom().bits());
    if base_bits.saturating_sub(1) * u64::from(magnitude) > MAX_RESULT_BITS {
        return Err(CalcError::ResultTooLarge { pos, max_bits: MAX_RESULT_BITS });
    }
    if base.is_zero() && exponent.is_negative() {
        return Err(CalcError::DivisionByZero { pos });
    }
    let numer = base.numer().pow(magnitude);
    let denom = base.denom().pow(magnitude);
    let value = if exponent.is_negative() { BigRational::new(denom, numer) } else { BigRational::new(numer, denom) };
    check_size(&value, pos)?;
    Ok(value)
}

/// `12`, `0.5`, `.5` or `3.` as an exact rational; `None` for `.` or two points.
fn parse_decimal(text: &str) -> Option<BigRational> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    if fraction.contains('.') || (whole.is_empty() && fraction.is_empty()) {
        return None;
    }
    let numerator: BigInt = format!("{whole}{fraction}").parse().ok()?;
    let scale = BigInt::from(10u32).pow(u32::try_from(fraction.len()).ok()?);
    Some(BigRational::new(numerator, scale))
}

/// `value` rounded to `significant` digits: positional for exponents in -6..15, else `d.ddde±n`.
fn approximate(value: &BigRational, significant: usize) -> String {
    if value.is_zero() {
        return "0".into();
    }
    let magnitude = value.abs();
    let mut exponent = decimal_exponent(&magnitude);
    let digits_shift = i64::try_from(significant).unwrap_or(i64::MAX) - 1 - exponent;
    let mut scaled = round_half_up(&(magnitude * pow10(digits_shift)));
    if scaled.to_string().len() > significant {
        scaled /= 10;
        exponent += 1;
    }
    let digits = scaled.to_string();
    let sign = if value.is_negative() { "-" } else { "" };
    let body = if (-6..15).contains(&exponent) {
        positional(&digits, exponent)
    } else {
        let (lead, rest) = digits.split_at(1);
        let rest = rest.trim_end_matches('0');
        let mantissa = if rest.is_empty() { lead.to_string() } else { format!("{lead}.{rest}") };
        format!("{mantissa}e{exponent}")
    };
    format!("{sign}{body}")
}

/// `digits` (d₀d₁d₂...) read as d₀.d₁d₂... × 10^exponent, without trailing fractional zeros.
fn positional(digits: &str, exponent: i64) -> String {
    let text = if exponent < 0 {
        let zeros = "0".repeat(usize::try_from(-exponent - 1).unwrap_or(0));
        format!("0.{zeros}{digits}")
    } else {
        let point = usize::try_from(exponent + 1).unwrap_or(0);
        if point >= digits.len() {
            format!("{digits}{}", "0".repeat(point - digits.len()))
        } else {
            format!("{}.{}", &digits[..point], &digits[point..])
        }
    };
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

/// `floor(log10(x))` for positive `x`.
fn decimal_exponent(x: &BigRational) -> i64 {
    let digits = |n: &BigInt| i64::try_from(n.to_string().len()).unwrap_or(i64::MAX);
    let mut exponent = digits(x.numer()) - digits(x.denom());
    while pow10(exponent) > *x {
        exponent -= 1;
    }
    while pow10(exponent + 1) <= *x {
        exponent += 1;
    }
    exponent
}

fn pow10(exponent: i64) -> BigRational {
    let power = BigInt::from(10u32).pow(u32::try_from(exponent.unsigned_abs()).unwrap_or(u32::MAX));
    if exponent >= 0 {
        BigRational::from_integer(power)
    } else {
        BigRational::new(BigInt::one(), power)
    }
}

fn round_half_up(x: &BigRational) -> BigInt {
    (x + BigRational::new(BigInt::one(), BigInt::from(2u32))).floor().to_integer()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(expression: &str) -> String {
        calculate(expression).map(|v| v.to_string()).unwrap_or_else(|e| e.to_string())
    }

    #[test]
    fn evaluates_exactly_with_precedence() {
        assert_eq!(shown("1 + 2 * 3"), "7");
        assert_eq!(shown("(1 + 2) * 3"), "9");
        assert_eq!(shown("2^3^2"), "512");
        assert_eq!(shown("-2^2"), "-4");
        assert_eq!(shown("2^-2"), "1/4 ≈ 0.25");
        assert_eq!(shown("0.1 + 0.2"), "3/10 ≈ 0.3");
        assert_eq!(shown("1/3"), "1/3 ≈ 0.333333333333");
        assert_eq!(shown("-2/3"), "-2/3 ≈ -0.666666666667");
        assert_eq!(shown("10^20/3"), "100000000000000000000/3 ≈ 3.33333333333e19");
        assert_eq!(shown("1/7000000"), "1/7000000 ≈ 1.42857142857e-7");
        assert_eq!(shown(" 3.  * .5 "), "3/2 ≈ 1.5");
        assert_eq!(shown("--3"), "3");
        let third = calculate("1/3").expect("valid");
        assert_eq!(third.approximate(3), "0.333");
        assert_eq!(third.approximate(usize::MAX).len(), 102);
        assert_eq!(calculate("2/3").expect("valid").approximate(0), "0.7");
    }

    #[test]
    fn refuses_with_positions() {
        assert_eq!(calculate(""), Err(CalcError::Empty));
        assert_eq!(calculate("   "), Err(CalcError::Empty));
        assert_eq!(calculate("2 + x"), Err(CalcError::Name { pos: 4, name: "x".into() }));
        assert_eq!(calculate("sqrt(2)"), Err(CalcError::Name { pos: 0, name: "sqrt".into() }));
        assert_eq!(calculate("(1 + 2"), Err(CalcError::UnclosedParen { pos: 0 }));
        assert_eq!(calculate("1 + 2)"), Err(CalcError::UnmatchedParen { pos: 5 }));
        assert_eq!(calculate("4 / (2 - 2)"), Err(CalcError::DivisionByZero { pos: 2 }));
        assert_eq!(calculate("0^-1"), Err(CalcError::DivisionByZero { pos: 1 }));
        assert_eq!(calculate("2^0.5"), Err(CalcError::NonIntegerExponent { pos: 1 }));
        assert_eq!(calculate("2^1001"), Err(CalcError::ExponentTooLarge { pos: 1, max: 1000 }));
        assert_eq!(calculate("12345^999"), Err(CalcError::ResultTooLarge { pos: 5, max_bits: 10_000 }));
        assert_eq!(calculate("(2^999)^11"), Err(CalcError::ResultTooLarge { pos: 7, max_bits: 10_000 }));
        let long_product = ["2^999"; 11].join(" * ");
        assert_eq!(calculate(&long_product), Err(CalcError::ResultTooLarge { pos: 78, max_bits: 10_000 }));
        assert_eq!(calculate("1.2.3"), Err(CalcError::MalformedNumber { pos: 0, text: "1.2.3".into() }));
        assert_eq!(calculate("2 % 3"), Err(CalcError::UnexpectedChar { pos: 2, found: '%' }));
        assert_eq!(
            calculate("2 *"),
            Err(CalcError::ExpectedOperand { pos: 3, found: "the end of the expression".into() })
        );
        assert!(matches!(calculate(&"1".repeat(1001)), Err(CalcError::TooLong { chars: 1001, .. })));
        assert!(matches!(calculate(&format!("{}1", "(".repeat(200))), Err(CalcError::TooDeep { .. })));
        assert_eq!(
            CalcError::Name { pos: 4, name: "x".into() }.to_string(),
            "unknown name `x` at position 4: only numbers, + - * / ^ and parentheses are allowed"
        );
    }
}
