//! Equivalence of two final answers, the way careful graders decide it.
//!
//! An answer is read into a small tree: tuples and intervals (order and bracket kind
//! matter), comma lists and `\{...\}` sets (order does not), unions of intervals, matrices,
//! and leaves. A leaf is an exact number when it evaluates in [`exact`](super::exact),
//! otherwise its canonical LaTeX text. `a \pm b` is read as the list `a+b, a-b`, and a
//! leading `x =` or `x \in` is dropped. Two answers are equivalent when their trees match.

use super::exact::{evaluate, Exact};
use super::latex::{group_end, normalize, render, Token};

/// A parsed final answer.
#[derive(Debug, Clone, PartialEq)]
enum Answer {
    Number(Exact),
    Text(String),
    /// A tuple, point or interval: `(1,2)`, `[0,1)`.
    Sequence {
        open: char,
        close: char,
        items: Vec<Answer>,
    },
    /// A comma list or a `\{...\}` set: the order of items does not matter.
    Collection(Vec<Answer>),
    /// `A \cup B \cup ...`: the order of the parts does not matter.
    Union(Vec<Answer>),
    Matrix(Vec<Vec<Answer>>),
}

/// Longest answer given the full treatment; a longer text is no final answer, and is only
/// compared verbatim (this also bounds the parsers' recursion).
const MAX_ANSWER_CHARS: usize = 1_000;

/// True when `a` and `b` are the same final answer in different spellings.
/// An empty answer is never equivalent to anything.
pub fn equivalent(a: &str, b: &str) -> bool {
    if a.len() > MAX_ANSWER_CHARS || b.len() > MAX_ANSWER_CHARS {
        return a.trim() == b.trim();
    }
    let (a, b) = (normalize(a), normalize(b));
    if a.is_empty() || b.is_empty() {
        return false;
    }
    parse(&a).matches(&parse(&b))
}

impl Answer {
    fn matches(&self, other: &Answer) -> bool {
        use Answer::*;
        match (self, other) {
            (Number(x), Number(y)) => x == y,
            (Text(x), Text(y)) => x == y,
            (Sequence { open, close, items }, Sequence { open: o, close: c, items: other_items }) => {
                open == o && close == c && all_match(items, other_items)
            }
            (Collection(x), Collection(y)) | (Union(x), Union(y)) => same_multiset(x, y),
            (Matrix(x), Matrix(y)) => x.len() == y.len() && x.iter().zip(y).all(|(r, s)| all_match(r, s)),
            _ => false,
        }
    }
}

fn all_match(x: &[Answer], y: &[Answer]) -> bool {
    x.len() == y.len() && x.iter().zip(y).all(|(a, b)| a.matches(b))
}

/// Every item of `x` pairs with a distinct item of `y`. Matching is an equivalence here
/// (exact numbers, equal strings), so taking the first free partner never blocks a pairing.
fn same_multiset(x: &[Answer], y: &[Answer]) -> bool {
    if x.len() != y.len() {
        return false;
    }
    let mut used = vec![false; y.len()];
    x.iter().all(|a| {
        let partner = (0..y.len()).find(|&j| !used[j] && a.matches(&y[j]));
        partner.map(|j| used[j] = true).is_some()
    })
}

fn parse(tokens: &[Token]) -> Answer {
    let tokens = strip_assignment(tokens);
    let parts = split_top_level(tokens, |t| t.is_command("cup"));
    if parts.len() > 1 {
        return Answer::Union(parts.into_iter().map(parse).collect());
    }
    let items = split_top_level(tokens, |t| t.is_char(','));
    if items.len() > 1 {
        return Answer::Collection(collection_items(&items));
    }
    if let Some(matrix) = parse_matrix(tokens) {
        return matrix;
    }
    if let Some(inner) = enclosed(tokens, &Token::Command("{".into()), &Token::Command("}".into())) {
        return Answer::Collection(collection_items(&split_top_level(inner, |t| t.is_char(','))));
    }
    if let Some(sequence) = parse_sequence(tokens) {
        return sequence;
    }
    if let Some(inner) = enclosed(tokens, &Token::Char('{'), &Token::Char('}')) {
        return parse(inner);
    }
    match plus_minus_expansion(tokens) {
        Some(both) => Answer::Collection(both),
        None => leaf(tokens),
    }
}

/// Items of a comma list, with every `a \pm b` item spread into its two values.
fn collection_items(parts: &[&[Token]]) -> Vec<Answer> {
    parts
        .iter()
        .flat_map(|part| match parse(part) {
            Answer::Collection(inner) if plus_minus_expansion(strip_assignment(part)).is_some() => inner,
            single => vec![single],
        })
        .collect()
}

fn leaf(tokens: &[Token]) -> Answer {
    if let Some(value) = evaluate(tokens) {
        return Answer::Number(value);
    }
    let text = render(tokens);
    let is_word = text.len() >= 3 && text.chars().all(|c| c.is_ascii_alphabetic());
    Answer::Text(if is_word { text.to_ascii_lowercase() } else { text })
}

/// `(a, b)` / `[a, b)` / ... with at least two items; `(a)` is plain grouping.
fn parse_sequence(tokens: &[Token]) -> Option<Answer> {
    let (Token::Char(open @ ('(' | '[')), Token::Char(close @ (')' | ']'))) = (tokens.first()?, tokens.last()?) else {
        return None;
    };
    if closing_index(tokens, 0)? != tokens.len() - 1 {
        return None;
    }
    let inner = &tokens[1..tokens.len() - 1];
    let items = split_top_level(inner, |t| t.is_char(','));
    if items.len() == 1 {
        return Some(parse(inner));
    }
    let items = items.into_iter().map(parse).collect();
    Some(Answer::Sequence { open: *open, close: *close, items })
}

/// `\begin{pmatrix} a & b \\ c & d \end{pmatrix}` (any `*matrix` environment).
fn parse_matrix(tokens: &[Token]) -> Option<Answer> {
    let begin_end = environment_name_end(tokens, 0, "begin")?;
    let end_start = (0..tokens.len()).rev().find(|&i| tokens[i].is_command("end"))?;
    if environment_name_end(tokens, end_start, "end")? != tokens.len() {
        return None;
    }
    let body = &tokens[begin_end..end_start];
    let rows = split_top_level(body, |t| t.is_command("\\"));
    let rows = rows.into_iter().filter(|row| !row.is_empty());
    let cells = |row: &[Token]| split_top_level(row, |t| t.is_char('&')).into_iter().map(parse).collect();
    Some(Answer::Matrix(rows.map(cells).collect()))
}

/// Index after `\begin{...matrix}` / `\end{...matrix}` starting at `at`.
fn environment_name_end(tokens: &[Token], at: usize, command: &str) -> Option<usize> {
    if !tokens.get(at)?.is_command(command) {
        return None;
    }
    let end = group_end(tokens, at + 1)?;
    render(&tokens[at + 2..end - 1]).ends_with("matrix").then_some(end)
}

/// The content between `open` and `close` when they enclose the whole stream.
fn enclosed<'a>(tokens: &'a [Token], open: &Token, close: &Token) -> Option<&'a [Token]> {
    let enclosing = tokens.first() == Some(open)
        && tokens.last() == Some(close)
        && tokens.len() >= 2
        && closing_index(tokens, 0) == Some(tokens.len() - 1);
    enclosing.then(|| &tokens[1..tokens.len() - 1])
}

fn bracket_depth_change(token: &Token) -> isize {
    match token {
        Token::Char('(' | '[' | '{') => 1,
        Token::Char(')' | ']' | '}') => -1,
        Token::Command(name) if name == "{" || name == "begin" => 1,
        Token::Command(name) if name == "}" || name == "end" => -1,
        _ => 0,
    }
}

/// Index of the token that brings the bracket depth opened at `open` back to zero.
fn closing_index(tokens: &[Token], open: usize) -> Option<usize> {
    let mut depth = 0isize;
    for (i, token) in tokens.iter().enumerate().skip(open) {
        depth += bracket_depth_change(token);
        if depth == 0 {
            return Some(i);
        }
    }
    None
}

/// Splits at separators that are outside every bracket, brace and environment.
fn split_top_level(tokens: &[Token], is_separator: impl Fn(&Token) -> bool) -> Vec<&[Token]> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0isize, 0usize);
    for (i, token) in tokens.iter().enumerate() {
        depth += bracket_depth_change(token);
        if depth == 0 && is_separator(token) {
            parts.push(&tokens[start..i]);
            start = i + 1;
        }
    }
    parts.push(&tokens[start..]);
    parts
}

/// Drops a leading `x =`, `x_1 =`, `\theta =` or `x \in` when it names a single variable.
fn strip_assignment(tokens: &[Token]) -> &[Token] {
    let name_len = match tokens.first() {
        Some(Token::Char(c)) if c.is_ascii_alphabetic() => 1,
        Some(Token::Command(name)) if name.chars().all(|c| c.is_ascii_alphabetic()) && name != "frac" => 1,
        _ => return tokens,
    };
    let subscript_len = match tokens.get(name_len) {
        Some(t) if t.is_char('_') => group_end(tokens, name_len + 1).map_or(0, |end| end - name_len),
        _ => 0,
    };
    let relation = name_len + subscript_len;
    let is_relation = tokens.get(relation).is_some_and(|t| t.is_char('=') || t.is_command("in"));
    let rest = &tokens[(relation + 1).min(tokens.len())..];
    let single_relation = !rest.iter().any(|t| t.is_char('='));
    if is_relation && single_relation && !rest.is_empty() {
        rest
    } else {
        tokens
    }
}

/// `a \pm b` (one top-level `\pm`) as the two answers `a+b` and `a-b`.
fn plus_minus_expansion(tokens: &[Token]) -> Option<Vec<Answer>> {
    let parts = split_top_level(tokens, |t| t.is_command("pm"));
    let [before, after] = parts[..] else {
        return None;
    };
    let spelled = |sign: char| {
        let mut spelled = before.to_vec();
        spelled.push(Token::Char(sign));
        spelled.extend_from_slice(after);
        leaf(&spelled)
    };
    Some(vec![spelled('+'), spelled('-')])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_compare_exactly() {
        assert!(equivalent("0.5", r"\frac{1}{2}"));
        assert!(equivalent("3.0", "3"));
        assert!(equivalent("1/2", r"\dfrac12"));
        assert!(equivalent(r"10\text{ cm}", "10"));
        assert!(equivalent("x = 5", "5"));
        assert!(equivalent(r"1,\!000", "1000"));
        assert!(!equivalent("0.333333", r"\frac13"));
        assert!(!equivalent("-3", "3"));
    }

    #[test]
    fn a_scale_word_multiplies_rather_than_being_a_unit() {
        assert!(equivalent("1500000", "1.5 million"));
        assert!(!equivalent("1.5", "1.5 million"));
        assert!(!equivalent("2", r"\$2 billion"));
    }

    #[test]
    fn tuples_keep_order_and_brackets() {
        assert!(equivalent(r"\left( 3, \frac{\pi}{2} \right)", r"(3,\pi/2)"));
        assert!(!equivalent("(1,2)", "(2,1)"));
        assert!(!equivalent("[1,2)", "(1,2]"));
        assert!(!equivalent("(1,2)", "1,2"));
        assert!(equivalent("x \\in [-2,7]", "[-2, 7]"));
    }

    #[test]
    fn lists_sets_and_unions_ignore_order() {
        assert!(equivalent("-2,1", "1, -2"));
        assert!(equivalent(r"\{1,2\}", "2,1"));
        assert!(equivalent(r"(0,9) \cup (9,36)", r"(9,36)\cup(0,9)"));
        assert!(!equivalent("1,2", "1,2,2"));
        assert!(equivalent(r"1 \pm \sqrt{19}", r"1-\sqrt{19}, 1+\sqrt{19}"));
        assert!(equivalent(r"\{1\pm\sqrt{5},-2\}", r"\{-2, 1+\sqrt5, 1-\sqrt5\}"));
    }

    #[test]
    fn text_answers_compare_canonically() {
        assert!(equivalent(r"\text{(C)}", "C"));
        assert!(equivalent(r"\text{(C)}", r"\textbf{(C)}"));
        assert!(!equivalent(r"\text{(C)}", "(B)"));
        assert!(equivalent(r"\text{Evelyn}", "evelyn"));
        assert!(equivalent("y = 2x + 3", "2x+3"));
        assert!(equivalent(r"\cot x", r"\cot  x"));
        assert!(!equivalent(r"\cot x", r"\cotx"));
        assert!(equivalent("4210_{5}", "4210_5"));
        assert!(!equivalent("4210_{5}", "4210"));
        assert!(!equivalent("", ""));
    }

    #[test]
    fn deep_or_huge_answers_are_handled_without_recursing_away() {
        let nested = format!("{}1{}", "(".repeat(400), ")".repeat(400));
        assert!(equivalent(&nested, "1"));
        let fractions = format!("{}1{}", r"\frac{".repeat(90), "}{1}".repeat(90));
        assert!(equivalent(&fractions, "1"));
        let huge = "(".repeat(200_000);
        assert!(equivalent(&huge, &huge) && !equivalent(&huge, "1"));
    }

    #[test]
    fn matrices_compare_cell_by_cell() {
        let gold = r"\begin{pmatrix} 1/5 \\ -18/5 \end{pmatrix}";
        assert!(equivalent(gold, r"\begin{pmatrix}\frac15\\-\frac{18}{5}\end{pmatrix}"));
        assert!(!equivalent(gold, r"\begin{pmatrix} -18/5 \\ 1/5 \end{pmatrix}"));
    }
}
