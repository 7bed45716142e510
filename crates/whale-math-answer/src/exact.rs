//! Exact values of numeric answers: rationals, square roots, π and i.
//!
//! `\frac{\sqrt3}{2}`, `\sqrt{3}/2` and `0.5\sqrt{3}` are one number, and so are `\sqrt{8}` and
//! `2\sqrt2`. Floating-point comparison would also call 0.333333 equal to 1/3, so numeric
//! answers are evaluated exactly into a sum of terms `c·√r·π^k·i^e` (c rational, r
//! square-free), a canonical form in which equal numbers have equal representations. Anything
//! outside that algebra (variables, `\infty`, division by a sum) is "not numeric" and the
//! caller compares it as text. Sizes are bounded so hostile input cannot exhaust memory.

use super::latex::Token;
use num_bigint::BigInt;
use num_integer::Integer;
use num_rational::BigRational;
use num_traits::{One, Signed, ToPrimitive, Zero};
use std::collections::BTreeMap;

/// Largest square-free radicand kept (square factors are found by trial division).
const MAX_RADICAND: u64 = 1_000_000_000_000;
const MAX_PI_POWER: i64 = 64;
const MAX_EXPONENT: i64 = 1024;
/// Largest exponent applied to a sum of several terms (the expansion grows quickly).
const MAX_SUM_EXPONENT: i64 = 16;
/// Largest size of one coefficient, numerator and denominator bits together.
const MAX_BITS: u64 = 20_000;
const MAX_TERMS: usize = 64;
const MAX_LITERAL_DIGITS: usize = 4_000;
const MAX_DEPTH: usize = 200;

/// The irrational part of a term: `√radicand · π^pi_power · (i if imaginary)`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Unit {
    radicand: u64,
    pi_power: i64,
    imaginary: bool,
}

impl Unit {
    const ONE: Unit = Unit { radicand: 1, pi_power: 0, imaginary: false };

    /// The product of two units as a rational factor times a unit.
    fn times(&self, other: &Unit) -> Option<(BigRational, Unit)> {
        let common = self.radicand.gcd(&other.radicand);
        let radicand = u128::from(self.radicand / common) * u128::from(other.radicand / common);
        let radicand = u64::try_from(radicand).ok().filter(|r| *r <= MAX_RADICAND)?;
        let pi_power = self.pi_power + other.pi_power;
        if pi_power.abs() > MAX_PI_POWER {
            return None;
        }
        let mut factor = BigRational::from_integer(BigInt::from(common));
        if self.imaginary && other.imaginary {
            factor = -factor;
        }
        let imaginary = self.imaginary != other.imaginary;
        Some((factor, Unit { radicand, pi_power, imaginary }))
    }
}

/// An exact number: a sum of rational multiples of distinct [`Unit`]s, zero terms omitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Exact {
    terms: BTreeMap<Unit, BigRational>,
}

impl Exact {
    fn zero() -> Self {
        Exact { terms: BTreeMap::new() }
    }

    fn term(coefficient: BigRational, unit: Unit) -> Self {
        let mut terms = BTreeMap::new();
        if !coefficient.is_zero() {
            terms.insert(unit, coefficient);
        }
        Exact { terms }
    }

    pub(crate) fn rational(value: BigRational) -> Self {
        Self::term(value, Unit::ONE)
    }

    fn pi() -> Self {
        Self::term(BigRational::one(), Unit { pi_power: 1, ..Unit::ONE })
    }

    fn imaginary_unit() -> Self {
        Self::term(BigRational::one(), Unit { imaginary: true, ..Unit::ONE })
    }

    /// The value as a rational, when it has no irrational or imaginary part.
    pub(crate) fn as_rational(&self) -> Option<BigRational> {
        match self.terms.len() {
            0 => Some(BigRational::zero()),
            1 => self.terms.get(&Unit::ONE).cloned(),
            _ => None,
        }
    }

    fn within_bounds(self) -> Option<Self> {
        let small = |c: &BigRational| c.numer().bits() + c.denom().bits() <= MAX_BITS;
        (self.terms.len() <= MAX_TERMS && self.terms.values().all(small)).then_some(self)
    }

    fn accumulate(&mut self, unit: Unit, coefficient: BigRational) {
        let entry = self.terms.entry(unit.clone()).or_insert_with(BigRational::zero);
        *entry += coefficient;
        if entry.is_zero() {
            self.terms.remove(&unit);
        }
    }

    fn plus(mut self, other: &Exact) -> Option<Exact> {
        for (unit, coefficient) in &other.terms {
            self.accumulate(unit.clone(), coefficient.clone());
        }
        self.within_bounds()
    }

    fn negated(mut self) -> Exact {
        for coefficient in self.terms.values_mut() {
            *coefficient = -coefficient.clone();
        }
        self
    }

    fn times(&self, other: &Exact) -> Option<Exact> {
        let mut product = Exact::zero();
        for (left_unit, left) in &self.terms {
            for (right_unit, right) in &other.terms {
                let (factor, unit) = left_unit.times(right_unit)?;
                product.accumulate(unit, factor * left * right);
            }
        }
        product.within_bounds()
    }

    /// `1/x` for a single nonzero term; division by a sum is outside the algebra.
    fn reciprocal(&self) -> Option<Exact> {
        let [(unit, coefficient)] = self.terms.iter().collect::<Vec<_>>()[..] else {
            return None;
        };
        // 1/(c·√r·π^k·i) = √r/(c·r) · π^-k · (-i)
        let mut inverse = (coefficient * BigRational::from_integer(unit.radicand.into())).recip();
        if unit.imaginary {
            inverse = -inverse;
        }
        let unit = Unit { pi_power: -unit.pi_power, ..unit.clone() };
        Exact::term(inverse, unit).within_bounds()
    }

    /// The principal square root of a rational times an even power of π.
    fn sqrt(&self) -> Option<Exact> {
        let [(unit, coefficient)] = self.terms.iter().collect::<Vec<_>>()[..] else {
            return self.terms.is_empty().then(Exact::zero);
        };
        if unit.radicand != 1 || unit.imaginary || unit.pi_power % 2 != 0 {
            return None;
        }
        // √(p/q) = √(p·q)/q
        let under = (coefficient.numer().abs() * coefficient.denom()).to_u64()?;
        if under > MAX_RADICAND {
            return None;
        }
        let (outside, radicand) = split_square_factor(under);
        let root = BigRational::new(outside.into(), coefficient.denom().clone());
        let unit = Unit { radicand, pi_power: unit.pi_power / 2, imaginary: coefficient.is_negative() };
        Some(Exact::term(root, unit))
    }

    fn power(&self, exponent: i64) -> Option<Exact> {
        let limit = if self.terms.len() > 1 { MAX_SUM_EXPONENT } else { MAX_EXPONENT };
        if exponent.unsigned_abs() > limit.unsigned_abs() || (self.terms.is_empty() && exponent <= 0) {
            return None;
        }
        let base = if exponent < 0 { self.reciprocal()? } else { self.clone() };
        let mut result = Exact::rational(BigRational::one());
        let mut square = base;
        let mut remaining = exponent.unsigned_abs();
        while remaining > 0 {
            if remaining & 1 == 1 {
                result = result.times(&square)?;
            }
            remaining >>= 1;
            if remaining > 0 {
                square = square.times(&square)?;
            }
        }
        Some(result)
    }
}

/// `n = outside² · radicand` with `radicand` square-free.
fn split_square_factor(mut n: u64) -> (u64, u64) {
    let (mut outside, mut radicand) = (1u64, 1u64);
    let mut p = 2u64;
    while p * p <= n {
        while Integer::is_multiple_of(&n, &(p * p)) {
            n /= p * p;
            outside *= p;
        }
        if Integer::is_multiple_of(&n, &p) {
            n /= p;
            radicand *= p;
        }
        p += 1;
    }
    (outside, radicand * n)
}

/// Evaluates a normalized token stream (see `latex::normalize`), or `None` when it is not a
/// number in the algebra of [`Exact`].
pub(crate) fn evaluate(tokens: &[Token]) -> Option<Exact> {
    let mut parser = Parser { tokens, pos: 0, depth: 0 };
    let value = parser.sum()?;
    (parser.pos == tokens.len()).then_some(value)
}

/// Recursive descent over `sum := [±] product (± product)*`,
/// `product := power ((*|/)? signed power)*` (juxtaposition multiplies),
/// `power := atom (^ {integer})?`.
struct Parser<'a> {
    tokens: &'a [Token],
    pos: usize,
    depth: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }

    fn eat(&mut self, c: char) -> bool {
        let matched = self.peek().is_some_and(|t| t.is_char(c));
        self.pos += usize::from(matched);
        matched
    }

    fn nested<T>(&mut self, parse: impl FnOnce(&mut Self) -> Option<T>) -> Option<T> {
        if self.depth >= MAX_DEPTH {
            return None;
        }
        self.depth += 1;
        let result = parse(self);
        self.depth -= 1;
        result
    }

    fn sum(&mut self) -> Option<Exact> {
        self.nested(|p| {
            let mut total = p.signed(Self::product)?;
            loop {
                if p.eat('+') {
                    total = total.plus(&p.product()?)?;
                } else if p.eat('-') {
                    total = total.plus(&p.product()?.negated())?;
                } else {
                    return Some(total);
                }
            }
        })
    }

    /// A leading sign (any number of them) applied to what `parse` reads next.
    fn signed(&mut self, parse: fn(&mut Self) -> Option<Exact>) -> Option<Exact> {
        if self.eat('-') {
            self.nested(|p| p.signed(parse)).map(Exact::negated)
        } else if self.eat('+') {
            self.nested(|p| p.signed(parse))
        } else {
            parse(self)
        }
    }

    fn product(&mut self) -> Option<Exact> {
        if let Some(mixed) = self.mixed_number() {
            return Some(mixed);
        }
        let mut product = self.power()?;
        loop {
            let token = self.peek();
            if token.is_some_and(|t| t.is_char('*') || t.is_command("cdot") || t.is_command("times")) {
                self.pos += 1;
                product = product.times(&self.signed(Self::power)?)?;
            } else if token.is_some_and(|t| t.is_char('/') || t.is_command("div")) {
                self.pos += 1;
                product = product.times(&self.signed(Self::power)?.reciprocal()?)?;
            } else if token.is_some_and(starts_atom) {
                product = product.times(&self.power()?)?;
            } else {
                return Some(product);
            }
        }
    }

    /// `137\frac{1}{2}` written as a mixed number means 137 + 1/2.
    fn mixed_number(&mut self) -> Option<Exact> {
        let whole_len =
            self.tokens[self.pos..].iter().take_while(|t| matches!(t, Token::Char(c) if c.is_ascii_digit())).count();
        let rest = &self.tokens[self.pos + whole_len..];
        let (numerator_len, rest) = braced_digits(rest.strip_prefix(&[Token::Command("frac".into())])?)?;
        let (denominator_len, rest) = braced_digits(rest)?;
        let ends_term = rest.first().is_none_or(|t| ['+', '-', ')', '}'].iter().any(|c| t.is_char(*c)));
        if whole_len == 0 || !ends_term {
            return None;
        }
        let start = self.pos;
        let number = |from: usize, len: usize| literal(&self.tokens[from..from + len]);
        let whole = number(start, whole_len)?;
        let numerator = number(start + whole_len + 2, numerator_len)?;
        let denominator = number(start + whole_len + 4 + numerator_len, denominator_len)?;
        if denominator.is_zero() {
            return None;
        }
        self.pos = start + whole_len + 5 + numerator_len + denominator_len;
        Some(Exact::rational(whole + numerator / denominator))
    }

    fn power(&mut self) -> Option<Exact> {
        let base = self.atom()?;
        if !self.eat('^') {
            return Some(base);
        }
        let exponent = self.group()?.as_rational()?;
        if !exponent.is_integer() {
            return None;
        }
        base.power(exponent.to_integer().to_i64()?)
    }

    fn group(&mut self) -> Option<Exact> {
        if !self.eat('{') {
            return None;
        }
        let inner = self.sum()?;
        self.eat('}').then_some(inner)
    }

    fn atom(&mut self) -> Option<Exact> {
        let token = self.peek()?.clone();
        match token {
            Token::Char(c) if c.is_ascii_digit() || c == '.' => self.number(),
            Token::Char('(') => {
                self.pos += 1;
                let inner = self.sum()?;
                self.eat(')').then_some(inner)
            }
            Token::Char('{') => self.group(),
            Token::Char('i') => {
                self.pos += 1;
                Some(Exact::imaginary_unit())
            }
            Token::Command(name) => {
                self.pos += 1;
                match name.as_str() {
                    "frac" => {
                        let numerator = self.group()?;
                        numerator.times(&self.group()?.reciprocal()?)
                    }
                    "sqrt" => self.group()?.sqrt(),
                    "pi" => Some(Exact::pi()),
                    _ => None,
                }
            }
            _ => None,
        }
    }

    fn number(&mut self) -> Option<Exact> {
        let len = self.tokens[self.pos..]
            .iter()
            .take_while(|t| matches!(t, Token::Char(c) if c.is_ascii_digit() || *c == '.'))
            .count();
        let value = literal(&self.tokens[self.pos..self.pos + len])?;
        self.pos += len;
        Some(Exact::rational(value))
    }
}

fn starts_atom(token: &Token) -> bool {
    match token {
        Token::Char(c) => c.is_ascii_digit() || ['.', '(', '{', 'i'].contains(c),
        Token::Command(name) => ["frac", "sqrt", "pi"].contains(&name.as_str()),
        Token::Space => false,
    }
}

/// Length of the digits in a leading `{digits}` group, and what follows the group.
fn braced_digits(tokens: &[Token]) -> Option<(usize, &[Token])> {
    let inner = tokens.strip_prefix(&[Token::Char('{')])?;
    let len = inner.iter().take_while(|t| matches!(t, Token::Char(c) if c.is_ascii_digit())).count();
    let rest = inner[len..].strip_prefix(&[Token::Char('}')])?;
    (len > 0).then_some((len, rest))
}

/// A decimal literal such as `12`, `0.5`, `.35625` or `3.`, exactly.
fn literal(tokens: &[Token]) -> Option<BigRational> {
    let text: String = tokens
        .iter()
        .map(|t| match t {
            Token::Char(c) => Some(*c),
            _ => None,
        })
        .collect::<Option<_>>()?;
    if text.len() > MAX_LITERAL_DIGITS {
        return None;
    }
    let (whole, fraction) = text.split_once('.').unwrap_or((&text, ""));
    let digits = format!("{whole}{fraction}");
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let numerator: BigInt = digits.parse().ok()?;
    let exponent = u32::try_from(fraction.len()).ok()?;
    Some(BigRational::new(numerator, BigInt::from(10u32).pow(exponent)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::latex::normalize;

    fn value(text: &str) -> Option<Exact> {
        evaluate(&normalize(text))
    }

    fn rational(n: i64, d: i64) -> Option<Exact> {
        Some(Exact::rational(BigRational::new(n.into(), d.into())))
    }

    #[test]
    fn rationals_in_every_spelling() {
        for text in [r"\frac{1}{2}", r"\dfrac12", "1/2", "0.5", ".5", r"\tfrac{2}{4}", "{1}/{2}"] {
            assert_eq!(value(text), rational(1, 2), "{text}");
        }
        assert_eq!(value("3.0"), rational(3, 1));
        assert_eq!(value(r"-\frac{24}{25}"), rational(-24, 25));
        assert_eq!(value(r"137 \frac{1}{2}"), rational(275, 2));
        assert_eq!(value(r"-1\frac{4}{5}"), rational(-9, 5));
        assert_eq!(value("2^{10}"), rational(1024, 1));
        assert_eq!(value("2^{-2}"), rational(1, 4));
        assert_eq!(value("-2^2"), rational(-4, 1));
    }

    #[test]
    fn surds_have_one_form() {
        assert_eq!(value(r"\sqrt{8}"), value(r"2\sqrt2"));
        assert_eq!(value(r"\frac{\sqrt{3}}{2}"), value(r"\sqrt3/2"));
        assert_eq!(value(r"\frac{\sqrt{3}}{2}"), value(r"0.5\sqrt{3}"));
        assert_eq!(value(r"\frac{1}{\sqrt{3}}"), value(r"\frac{\sqrt3}{3}"));
        assert_eq!(value(r"\sqrt{\frac{1}{2}}"), value(r"\frac{\sqrt{2}}{2}"));
        assert_eq!(value(r"\sqrt2\cdot\sqrt8"), rational(4, 1));
        assert_eq!(value(r"(1+\sqrt2)^2"), value(r"3+2\sqrt2"));
        assert_ne!(value(r"\sqrt{2}"), value(r"\sqrt{3}"));
    }

    #[test]
    fn pi_and_i_are_symbols() {
        assert_eq!(value(r"\frac{\pi}{2}"), value(r"0.5\pi"));
        assert_eq!(value(r"\frac{5 \pi^2}{4}"), value(r"1.25\pi\pi"));
        assert_eq!(value("7i-2"), value("-2 + 7i"));
        assert_eq!(value("i^2"), rational(-1, 1));
        assert_eq!(value(r"\sqrt{-4}"), value("2i"));
        assert_ne!(value(r"\pi"), value("3.14159"));
    }

    #[test]
    fn non_numbers_are_refused() {
        for text in ["2k+2", r"\infty", "x^2", r"\frac{1}{0}", r"\frac{1}{1+\sqrt2}", "2^{1/2}", "0^{-1}", "1.2.3"] {
            assert_eq!(value(text), None, "{text}");
        }
        assert_eq!(value("10^{100000}"), None, "exponent bound");
        assert_eq!(value(&"(".repeat(500)), None, "depth bound");
    }
}
