//! Answer spellings and extraction: the spellings the issues named, the extraction order, and
//! rationals in many spellings (property tests).

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{Signed, Zero};
use proptest::prelude::*;
use serde_json::json;
use whale_math_answer::{equivalent, extract_answer, Extractor, DEFAULT_ORDER};

fn with_thousands_separators(n: i64) -> String {
    let reversed: Vec<char> = n.unsigned_abs().to_string().chars().rev().collect();
    let groups: Vec<String> = reversed.chunks(3).rev().map(|group| group.iter().rev().collect()).collect();
    let sign = if n < 0 { "-" } else { "" };
    format!("{sign}{}", groups.join(","))
}

#[test]
fn issue_spellings_are_equivalent() {
    let same = [
        ("42", "42.0"),
        ("42", "42.000"),
        ("1234", "1,234"),
        ("1234567", r"1{,}234{,}567"),
        ("0.5", r"\frac{1}{2}"),
        ("0.5", "1/2"),
        (r"\frac12", r"\dfrac{1}{2}"),
        (r"\frac12", r"\tfrac12"),
        (r"\frac{3}{4}", "0.75"),
        (r"\frac{6}{8}", r"\frac34"),
        ("3", "3.0"),
        ("-3", r"-\frac{6}{2}"),
        ("-0.25", r"\frac{-1}{4}"),
        (r"\left( 1, 2 \right)", "(1,2)"),
        ("( 1 , 2 )", "(1,2)"),
        (r"10\text{ cm}", "10"),
        (r"10 \text{cm}^2", "10"),
        (r"90^\circ", "90"),
        (r"90^{\circ}", "90"),
        (r"25\%", "25"),
        (r"\$ 5", "5"),
        ("x = 7", "7"),
        (r"x \in [1, 2)", "[1,2)"),
        (r"\sqrt2", r"\sqrt{2}"),
        ("√2", r"\sqrt{2}"),
        (r"2\sqrt{3}", r"2\sqrt3"),
        (r"2\sqrt{3}", r"\sqrt{12}"),
        (r"1,\!000", "1000"),
        (r"1\,000", "1000"),
        (r"\displaystyle\frac{1}{3}", r"\frac13"),
        ("7.", "7"),
        (r"5\mbox{ inches}", "5"),
        (r"\frac{\sqrt{3}}{2}", r"\frac{\sqrt3}{2}"),
        (r"\frac{\sqrt{3}}{2}", r"\sqrt{3}/2"),
        (r"\frac{\sqrt{3}}{2}", r"\frac{1}{2}\sqrt{3}"),
        (r"\text{(C)}", "C"),
        (r"\text{(C)}", "(C)"),
        (r"\text{(C)}", r"\textbf{(C)}"),
        (r"\boxed{12}", "12"),
    ];
    for (a, b) in same {
        assert!(equivalent(a, b), "{a} == {b}");
        assert!(equivalent(b, a), "{b} == {a}");
    }
    let different = [
        ("(1,2)", "(2,1)"),
        ("[1,2)", "(1,2]"),
        ("[1,2]", "(1,2)"),
        ("3", "-3"),
        ("0.5", "0.05"),
        (r"\frac{\sqrt{3}}{2}", r"\frac{\sqrt{2}}{2}"),
        (r"\frac{\sqrt{3}}{2}", "0.866025403784"),
        (r"\text{(C)}", r"\text{(D)}"),
        ("1000", "100"),
        ("1,000", "1,00"),
        ("12", "120"),
        (r"2\sqrt{3}", r"3\sqrt{2}"),
        ("x", "y"),
    ];
    for (a, b) in different {
        assert!(!equivalent(a, b), "{a} != {b}");
    }
}

#[test]
fn extraction_order_is_configurable() {
    let text = "I first thought \\boxed{3}. The answer is 4. #### 5 apples\nthen 6";
    let extract = |order: &[Extractor]| extract_answer(text, order);
    assert_eq!(extract(&DEFAULT_ORDER).as_deref(), Some("3"));
    assert_eq!(extract(&[Extractor::AnswerIs, Extractor::Boxed]).as_deref(), Some("4"));
    assert_eq!(extract(&[Extractor::Hashes]).as_deref(), Some("5"));
    assert_eq!(extract(&[Extractor::LastNumber]).as_deref(), Some("6"));
    assert_eq!(extract(&[]), None);
    let order: Vec<Extractor> = serde_json::from_value(json!(["last_number", "boxed"])).expect("names");
    assert_eq!(order, vec![Extractor::LastNumber, Extractor::Boxed]);
}

/// `p/q` (q > 0, reduced) as a terminating decimal, when it has one.
fn terminating_decimal(p: &BigInt, q: &BigInt) -> Option<String> {
    let mut rest = q.clone();
    let (mut twos, mut fives) = (0u32, 0u32);
    while (&rest % 2u32).is_zero() {
        rest /= 2u32;
        twos += 1;
    }
    while (&rest % 5u32).is_zero() {
        rest /= 5u32;
        fives += 1;
    }
    if rest != BigInt::from(1) {
        return None;
    }
    let places = twos.max(fives) as usize;
    let scaled = (p.abs() * BigInt::from(10u32).pow(places as u32) / q).to_string();
    let padded = format!("{scaled:0>width$}", width = places + 1);
    let (whole, fraction) = padded.split_at(padded.len() - places);
    let sign = if p.is_negative() { "-" } else { "" };
    Some(if places == 0 { format!("{sign}{whole}") } else { format!("{sign}{whole}.{fraction}") })
}

fn spellings(p: i64, q: i64, k: i64) -> Vec<String> {
    let sign = if p < 0 { "-" } else { "" };
    let a = p.abs();
    let mut out = vec![
        format!(r"{sign}\frac{{{a}}}{{{q}}}"),
        format!(r"{sign}\dfrac{{{a}}}{{{q}}}"),
        format!(r"\frac{{{p}}}{{{q}}}"),
        format!("{p}/{q}"),
        format!(r"{sign}\tfrac{{ {} }}{{ {} }}", a * k, q * k),
        format!(r"\displaystyle \left( {sign}\frac{{{a}}}{{{q}}} \right)"),
        format!(r"\boxed{{{p}/{q}}}"),
    ];
    if a <= 9 && q <= 9 {
        out.push(format!(r"{sign}\frac{a}{q}"));
    }
    let value = BigRational::new(p.into(), q.into());
    if let Some(decimal) = terminating_decimal(value.numer(), value.denom()) {
        if decimal.contains('.') {
            out.push(format!("{decimal}0"));
        }
        out.push(format!(r"{decimal}\text{{ m}}"));
        out.push(decimal);
    }
    if value.is_integer() {
        let n: i64 = p / q;
        out.push(with_thousands_separators(n));
        out.push(format!("{n}.0"));
        out.push(format!("x = {n}"));
    }
    out
}

fn rational_value(spelling: &str) -> BigRational {
    let (p, q) = spelling.split_once('/').expect("a p/q spelling");
    BigRational::new(p.parse::<BigInt>().expect("p"), q.parse::<BigInt>().expect("q"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn every_spelling_of_a_rational_is_equivalent(p in -20_000i64..20_000, q in 1i64..500, k in 2i64..9) {
        let all = spellings(p, q, k);
        for a in &all {
            for b in &all {
                prop_assert!(equivalent(a, b), "{} vs {}", a, b);
            }
        }
    }

    #[test]
    fn distinct_rationals_are_never_equivalent(
        (p1, q1) in (-2_000i64..2_000, 1i64..60),
        (p2, q2) in (-2_000i64..2_000, 1i64..60),
        i in 0usize..20,
        j in 0usize..20,
    ) {
        let (a, b) = (spellings(p1, q1, 2), spellings(p2, q2, 3));
        let (a, b) = (&a[i % a.len()], &b[j % b.len()]);
        let same = rational_value(&format!("{p1}/{q1}")) == rational_value(&format!("{p2}/{q2}"));
        prop_assert_eq!(equivalent(a, b), same, "{} vs {}", a, b);
    }

    #[test]
    fn grading_never_panics(a in "\\PC{0,60}", b in r"[\\{}()\[\],.0-9a-z^_$ +\-*/=]{0,40}") {
        let _ = equivalent(&a, &b);
        let _ = equivalent(&b, &b);
        let _ = extract_answer(&a, &DEFAULT_ORDER);
        let _ = extract_answer(&b, &DEFAULT_ORDER);
    }
}
