//! LaTeX answers as token streams, and the normalization that makes spellings comparable.
//!
//! Graders disagree with models mostly about spelling, not mathematics: `\dfrac12` vs
//! `\frac{1}{2}`, `10\text{ cm}` vs `10`, `1,\!000` vs `1000`. Working on tokens rather than
//! raw strings keeps each rewrite local and safe (a `\,` thin space is one token, a `{...}`
//! group is found by brace matching), and the canonical token stream feeds both the
//! structural parser and the exact numeric evaluator.

/// One lexical unit of a LaTeX answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Token {
    /// `\name` (a run of letters) or `\c` (one other character), without the backslash.
    Command(String),
    Char(char),
    Space,
}

impl Token {
    pub(crate) fn is_char(&self, c: char) -> bool {
        matches!(self, Token::Char(x) if *x == c)
    }

    pub(crate) fn is_command(&self, name: &str) -> bool {
        matches!(self, Token::Command(x) if x == name)
    }
}

/// Commands that carry no mathematical content in an answer (spacing, sizing, delimiters of
/// math mode, currency and percent signs).
const NOISE_COMMANDS: &[&str] = &[
    "displaystyle",
    "textstyle",
    "left",
    "right",
    "big",
    "Big",
    "bigg",
    "Bigg",
    "bigl",
    "bigr",
    "Bigl",
    "Bigr",
    "!",
    ",",
    ";",
    ":",
    " ",
    "quad",
    "qquad",
    "$",
    "%",
    "(",
    ")",
    "[",
    "]",
    "circ",
    "degree",
];

/// Commands whose braced argument is text (a unit, a word, a choice such as `(C)`): all of them
/// are read as `\text`, with or without spaces before the brace (`\mbox {cm}`).
pub(crate) const TEXT_COMMANDS: [&str; 10] =
    ["text", "mbox", "textbf", "textrm", "textit", "textnormal", "textsf", "textup", "mathrm", "mathbf"];

/// Spellings of the same command, mapped to the canonical name (besides [`TEXT_COMMANDS`]).
const SYNONYMS: &[(&str, &str)] =
    &[("dfrac", "frac"), ("tfrac", "frac"), ("le", "leq"), ("ge", "geq"), ("lbrace", "{"), ("rbrace", "}")];

/// Splits `text` into tokens, mapping common Unicode math symbols to their LaTeX commands.
pub(crate) fn tokenize(text: &str) -> Vec<Token> {
    let mut tokens = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        let token = match c {
            '\\' => match chars.next() {
                Some(first) if first.is_ascii_alphabetic() => {
                    let mut name = first.to_string();
                    while let Some(&next) = chars.peek().filter(|n| n.is_ascii_alphabetic()) {
                        name.push(next);
                        chars.next();
                    }
                    // As in TeX, spaces after a control word are not text: `\text {cm}`.
                    while chars.next_if(|n| n.is_whitespace()).is_some() {}
                    Token::Command(name)
                }
                Some(other) if other.is_whitespace() => Token::Command(" ".into()),
                Some(other) => Token::Command(other.to_string()),
                None => Token::Char('\\'),
            },
            c if c.is_whitespace() || c == '~' => Token::Space,
            '√' => Token::Command("sqrt".into()),
            'π' => Token::Command("pi".into()),
            '∞' => Token::Command("infty".into()),
            '±' => Token::Command("pm".into()),
            '∪' => Token::Command("cup".into()),
            '×' => Token::Command("times".into()),
            '·' | '⋅' => Token::Command("cdot".into()),
            '÷' => Token::Command("div".into()),
            '−' | '–' => Token::Char('-'),
            '°' => continue,
            c => Token::Char(c),
        };
        tokens.push(token);
    }
    tokens
}

/// Writes tokens back as LaTeX; a space is kept only where it separates a command name from
/// a following letter (`\cot x`), so equal token streams render to equal strings.
pub(crate) fn render(tokens: &[Token]) -> String {
    let mut out = String::new();
    let mut after_word_command = false;
    for token in tokens {
        match token {
            Token::Command(name) => {
                out.push('\\');
                out.push_str(name);
            }
            Token::Char(c) => {
                if after_word_command && c.is_ascii_alphabetic() {
                    out.push(' ');
                }
                out.push(*c);
            }
            Token::Space => out.push(' '),
        }
        after_word_command =
            matches!(token, Token::Command(name) if name.starts_with(|c: char| c.is_ascii_alphabetic()));
    }
    out
}

/// Index one past the `}` that closes the `{` at `open`, if `tokens[open]` is `{` and it closes.
pub(crate) fn group_end(tokens: &[Token], open: usize) -> Option<usize> {
    if !tokens.get(open)?.is_char('{') {
        return None;
    }
    let mut depth = 0usize;
    for (i, token) in tokens.iter().enumerate().skip(open) {
        if token.is_char('{') {
            depth += 1;
        } else if token.is_char('}') {
            depth -= 1;
            if depth == 0 {
                return Some(i + 1);
            }
        }
    }
    None
}

/// The canonical token stream of an answer: noise removed, synonyms merged, units, boxes,
/// trailing periods and thousands separators stripped, and every argument of `\frac`,
/// `\sqrt`, `^` and `_` braced. Contains no [`Token::Space`].
pub(crate) fn normalize(text: &str) -> Vec<Token> {
    let tokens = merge_synonyms(tokenize(text));
    let tokens = drop_degrees(tokens);
    let tokens = drop_noise(tokens);
    let tokens = merge_brace_commas(tokens);
    let tokens = unwrap_boxes(tokens);
    let tokens = strip_units(trim_end(tokens));
    let tokens: Vec<Token> = tokens.into_iter().filter(|t| *t != Token::Space).collect();
    let tokens = brace_arguments(&tokens);
    drop_thousands_separators(tokens)
}

fn merge_synonyms(tokens: Vec<Token>) -> Vec<Token> {
    tokens.into_iter().map(canonical_command).collect()
}

fn canonical_command(token: Token) -> Token {
    let Token::Command(name) = &token else { return token };
    if TEXT_COMMANDS.contains(&name.as_str()) {
        return Token::Command("text".into());
    }
    SYNONYMS.iter().find(|(from, _)| from == name).map_or(token, |(_, to)| Token::Command((*to).into()))
}

/// Removes `^\circ` and `^{\circ}` (the degree sign) as a whole.
fn drop_degrees(tokens: Vec<Token>) -> Vec<Token> {
    let mut out = Vec::with_capacity(tokens.len());
    let mut i = 0;
    while i < tokens.len() {
        let is_caret = tokens[i].is_char('^');
        let next = |k: usize| tokens.get(i + k);
        if is_caret && next(1).is_some_and(|t| t.is_command("circ")) {
            i += 2;
        } else if is_caret
            && next(1).is_some_and(|t| t.is_char('{'))
            && next(2).is_some_and(|t| t.is_command("circ"))
            && next(3).is_some_and(|t| t.is_char('}'))
        {
            i += 4;
        } else {
            out.push(tokens[i].clone());
            i += 1;
        }
    }
    out
}

/// Drops spacing/sizing commands, math-mode delimiters, `$`, `%`, and the `.` of `\left.`.
fn drop_noise(tokens: Vec<Token>) -> Vec<Token> {
    let mut out: Vec<Token> = Vec::with_capacity(tokens.len());
    let mut after_delimiter_command = false;
    for token in tokens {
        let skip = match &token {
            Token::Command(name) => NOISE_COMMANDS.contains(&name.as_str()),
            Token::Char(c) => *c == '$' || *c == '%' || (*c == '.' && after_delimiter_command),
            Token::Space => false,
        };
        after_delimiter_command = token.is_command("left") || token.is_command("right");
        if !skip {
            out.push(token);
        }
    }
    out
}

/// `{,}` (a comma that LaTeX should not space) becomes a plain comma.
fn merge_brace_commas(tokens: Vec<Token>) -> Vec<Token> {
    let mut out: Vec<Token> = Vec::with_capacity(tokens.len());
    for token in tokens {
        let n = out.len();
        if token.is_char('}') && n >= 2 && out[n - 1].is_char(',') && out[n - 2].is_char('{') {
            out.truncate(n - 2);
            out.push(Token::Char(','));
        } else {
            out.push(token);
        }
    }
    out
}

/// `\boxed{x}` and `\fbox{x}` become `x`.
fn unwrap_boxes(tokens: Vec<Token>) -> Vec<Token> {
    let mut out = Vec::with_capacity(tokens.len());
    let mut i = 0;
    while i < tokens.len() {
        let token = &tokens[i];
        if token.is_command("boxed") || token.is_command("fbox") {
            let open = skip_spaces(&tokens, i + 1);
            if let Some(end) = group_end(&tokens, open) {
                out.extend(unwrap_boxes(tokens[open + 1..end - 1].to_vec()));
                i = end;
                continue;
            }
            i += 1;
            continue;
        }
        out.push(token.clone());
        i += 1;
    }
    out
}

fn skip_spaces(tokens: &[Token], mut i: usize) -> usize {
    while tokens.get(i) == Some(&Token::Space) {
        i += 1;
    }
    i
}

/// Trims surrounding spaces and any sentence-ending periods.
fn trim_end(mut tokens: Vec<Token>) -> Vec<Token> {
    while tokens.last().is_some_and(|t| *t == Token::Space || t.is_char('.')) {
        tokens.pop();
    }
    let start = skip_spaces(&tokens, 0);
    tokens.split_off(start)
}

/// Powers of ten that a word after a number stands for: `1.5 million` is no unit.
const SCALE_WORDS: [(&str, u32); 4] = [("thousand", 3), ("million", 6), ("billion", 9), ("trillion", 12)];

/// Removes trailing units: a `\text{...}` group (with an optional `^2`) after some content,
/// or a plain word after a number (`10 cm`). An answer that is only `\text{X}` becomes `X`.
/// A scale word ends the stripping as a factor: `3\text{ million}\text{ dollars}` → `3\cdot10^{6}`.
fn strip_units(mut tokens: Vec<Token>) -> Vec<Token> {
    loop {
        let body_end = tokens.len() - trailing_power_len(&tokens);
        let unit_start = text_group_start(&tokens[..body_end]).or_else(|| plain_unit_start(&tokens[..body_end]));
        let scaled = unit_start.filter(|&start| start > 0 && body_end == tokens.len());
        if let Some((start, power)) = scaled.and_then(|start| Some((start, scale_power(&tokens[start..])?))) {
            return times_power_of_ten(tokens, start, power);
        }
        match unit_start {
            Some(start) if tokens[..start].iter().any(|t| *t != Token::Space) => {
                tokens.truncate(start);
                tokens = trim_end(tokens);
            }
            Some(0) => return trim_end(tokens[2..body_end - 1].to_vec()),
            _ => return tokens,
        }
    }
}

/// The power of ten of a unit (a plain word or a `\text{}` group) that is a scale word.
fn scale_power(unit: &[Token]) -> Option<u32> {
    let letters: String = unit
        .iter()
        .filter_map(|t| match t {
            Token::Char(c) if c.is_alphabetic() => Some(*c),
            _ => None,
        })
        .collect();
    let word = letters.strip_suffix(['s', 'S']).unwrap_or(&letters);
    SCALE_WORDS.iter().find(|(name, _)| word.eq_ignore_ascii_case(name)).map(|(_, power)| *power)
}

/// `tokens[..end]` times `10^{power}`.
fn times_power_of_ten(mut tokens: Vec<Token>, end: usize, power: u32) -> Vec<Token> {
    tokens.truncate(end);
    tokens.push(Token::Command("cdot".into()));
    tokens.extend(format!("10^{{{power}}}").chars().map(Token::Char));
    tokens
}

/// Length of a trailing `^x` or `^{...}` (the power of a unit such as `cm^2`).
fn trailing_power_len(tokens: &[Token]) -> usize {
    let n = tokens.len();
    if n >= 2 && tokens[n - 2].is_char('^') {
        return 2;
    }
    if !tokens.last().is_some_and(|t| t.is_char('}')) {
        return 0;
    }
    (0..n)
        .rev()
        .find(|&open| tokens[open].is_char('{') && group_end(tokens, open) == Some(n))
        .filter(|&open| open >= 1 && tokens[open - 1].is_char('^'))
        .map_or(0, |open| n - open + 1)
}

/// Start of a `\text{...}` group that ends the stream.
fn text_group_start(tokens: &[Token]) -> Option<usize> {
    let n = tokens.len();
    (0..n.saturating_sub(1)).rev().find(|&i| tokens[i].is_command("text") && group_end(tokens, i + 1) == Some(n))
}

/// Start of a space-separated word of two or more letters that follows a digit or a radical
/// (`10 cm`, `6\sqrt{3} cm`).
fn plain_unit_start(tokens: &[Token]) -> Option<usize> {
    let word_len = tokens.iter().rev().take_while(|t| matches!(t, Token::Char(c) if c.is_ascii_alphabetic())).count();
    let space = tokens.len().checked_sub(word_len + 1)?;
    let after_quantity = space.checked_sub(1).is_some_and(|last| ends_digit_or_radical(&tokens[..=last]));
    (word_len >= 2 && tokens[space] == Token::Space && after_quantity).then_some(space)
}

/// True when the stream ends in a digit or in the braced argument of `\sqrt` / `\sqrt[n]`.
fn ends_digit_or_radical(tokens: &[Token]) -> bool {
    match tokens.last() {
        Some(Token::Char(c)) if c.is_ascii_digit() => true,
        Some(Token::Char('}')) => group_start(tokens).is_some_and(|open| follows_sqrt(&tokens[..open])),
        _ => false,
    }
}

/// Index of the `{` that the final `}` of `tokens` closes.
fn group_start(tokens: &[Token]) -> Option<usize> {
    let mut depth = 0usize;
    for (i, token) in tokens.iter().enumerate().rev() {
        if token.is_char('}') {
            depth += 1;
        } else if token.is_char('{') {
            depth = depth.checked_sub(1)?;
            if depth == 0 {
                return Some(i);
            }
        }
    }
    None
}

/// True when `tokens` ends in `\sqrt` or in `\sqrt[...]`.
fn follows_sqrt(tokens: &[Token]) -> bool {
    let before_index = match tokens.last() {
        Some(t) if t.is_char(']') => tokens.iter().rposition(|t| t.is_char('[')).unwrap_or(0),
        _ => tokens.len(),
    };
    before_index.checked_sub(1).is_some_and(|i| tokens[i].is_command("sqrt"))
}

/// The number of arguments a command takes whose single-token form gets braced.
fn braced_arity(token: &Token) -> usize {
    match token {
        Token::Command(name) if name == "frac" => 2,
        Token::Command(name) if name == "sqrt" => 1,
        Token::Char('^') | Token::Char('_') => 1,
        _ => 0,
    }
}

/// `\frac12` → `\frac{1}{2}`, `\sqrt2` → `\sqrt{2}`, `x^2` → `x^{2}`, recursively.
fn brace_arguments(tokens: &[Token]) -> Vec<Token> {
    let mut out = Vec::with_capacity(tokens.len() + 8);
    let mut i = 0;
    while i < tokens.len() {
        let arity = braced_arity(&tokens[i]);
        out.push(tokens[i].clone());
        i += 1;
        if tokens[i - 1].is_command("sqrt") && tokens.get(i).is_some_and(|t| t.is_char('[')) {
            let index_end = tokens[i..].iter().position(|t| t.is_char(']')).map_or(tokens.len(), |p| i + p + 1);
            out.extend_from_slice(&tokens[i..index_end]);
            i = index_end;
        }
        for _ in 0..arity {
            let Some(arg) = tokens.get(i) else { break };
            out.push(Token::Char('{'));
            match group_end(tokens, i) {
                Some(end) => {
                    out.extend(brace_arguments(&tokens[i + 1..end - 1]));
                    i = end;
                }
                None => {
                    out.push(arg.clone());
                    i += 1;
                }
            }
            out.push(Token::Char('}'));
        }
    }
    out
}

/// `12,345.5` → `12345.5` when the whole answer is one number grouped by thousands.
fn drop_thousands_separators(tokens: Vec<Token>) -> Vec<Token> {
    if is_thousands_grouped(&render(&tokens)) {
        tokens.into_iter().filter(|t| !t.is_char(',')).collect()
    } else {
        tokens
    }
}

/// True for a number written with thousands separators: `-1,234`, `12,345.5`.
pub fn is_thousands_grouped(text: &str) -> bool {
    let unsigned = text.strip_prefix('-').unwrap_or(text);
    let (whole, fraction) = unsigned.split_once('.').unwrap_or((unsigned, ""));
    let mut groups = whole.split(',');
    let first_ok = groups.next().is_some_and(|g| (1..=3).contains(&g.len()) && is_digits(g));
    let rest: Vec<&str> = groups.collect();
    first_ok
        && !rest.is_empty()
        && rest.iter().all(|g| g.len() == 3 && is_digits(g))
        && (fraction.is_empty() || is_digits(fraction))
}

fn is_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(text: &str) -> String {
        render(&normalize(text))
    }

    #[test]
    fn noise_and_synonyms_disappear() {
        assert_eq!(canon(r"\displaystyle \dfrac{1}{2}"), r"\frac{1}{2}");
        assert_eq!(canon(r"\left( 3, \frac{\pi}{2} \right)"), r"(3,\frac{\pi}{2})");
        assert_eq!(canon(r"\$18.90"), "18.90");
        assert_eq!(canon(r"45\%"), "45");
        assert_eq!(canon("$42$."), "42");
        assert_eq!(canon(r"\left. x \right|"), "x|");
    }

    #[test]
    fn degrees_units_and_boxes_are_stripped() {
        assert_eq!(canon(r"106^\circ"), "106");
        assert_eq!(canon(r"106^{\circ}"), "106");
        assert_eq!(canon("106°"), "106");
        assert_eq!(canon(r"15\mbox{ cm}^2"), "15");
        assert_eq!(canon(r"5.4 \text{ cents}"), "5.4");
        assert_eq!(canon(r"8\sqrt{3} \text { square inches}"), r"8\sqrt{3}");
        assert_eq!(canon(r"\frac {1} {2}"), canon(r"\frac{1}{2}"));
        assert_eq!(canon(r"\frac{270}7\text{ degrees}"), r"\frac{270}{7}");
        assert_eq!(canon("10 cm"), "10");
        assert_eq!(canon("1.5 million"), r"1.5\cdot10^{6}");
        assert_eq!(canon("3 Millions"), r"3\cdot10^{6}");
        assert_eq!(canon(r"\$2 Billion."), r"2\cdot10^{9}");
        assert_eq!(canon(r"3\text{ million}\text{ dollars}"), r"3\cdot10^{6}");
        assert_eq!(canon(r"\text{million}"), "million");
        assert_eq!(canon(r"\text{(C)}"), "(C)");
        assert_eq!(canon(r"\boxed{\frac12}"), r"\frac{1}{2}");
    }

    #[test]
    fn units_after_radicals_go_whatever_the_spacing() {
        for (spelled, canonical) in [
            (r"5\sqrt{2}\text{ cm}", r"5\sqrt{2}"),
            (r"\sqrt 3 \mbox { units}", r"\sqrt{3}"),
            ("2\\sqrt6\\mathrm\t{m}^2", r"2\sqrt{6}"),
            (r"\sqrt[3]{4}\textup {cm}", r"\sqrt[3]{4}"),
            (r"6\sqrt{3} cm", r"6\sqrt{3}"),
            (r"\sqrt[3]{4} cm", r"\sqrt[3]{4}"),
            (r"7\sqrt{2}\,\textnormal  { square feet}", r"7\sqrt{2}"),
            (r"\textrm {Evelyn}", "Evelyn"),
        ] {
            assert_eq!(canon(spelled), canonical, "{spelled}");
        }
        assert_eq!(canon(r"x^{2} cm"), r"x^{2}cm", "a word is a unit only after a number or a radical");
        assert_eq!(canon(r"[0,1] cm"), "[0,1]cm");
    }

    #[test]
    fn arguments_get_braces() {
        assert_eq!(canon(r"\frac 34"), r"\frac{3}{4}");
        assert_eq!(canon(r"\frac9{19}"), r"\frac{9}{19}");
        assert_eq!(canon(r"\sqrt2"), r"\sqrt{2}");
        assert_eq!(canon("√2"), r"\sqrt{2}");
        assert_eq!(canon(r"\frac{\sqrt3}{2}"), r"\frac{\sqrt{3}}{2}");
        assert_eq!(canon("4210_{5}"), canon("4210_5"));
        assert_eq!(canon(r"\cot x"), r"\cot x");
    }

    #[test]
    fn thousands_separators_only_in_lone_numbers() {
        assert_eq!(canon(r"1,\!000"), "1000");
        assert_eq!(canon(r"11,\! 111,\! 111,\! 100"), "11111111100");
        assert_eq!(canon("1{,}000"), "1000");
        assert_eq!(canon("-2,1"), "-2,1");
        assert_eq!(canon("3, 5, 7"), "3,5,7");
        assert_eq!(canon("1,0000"), "1,0000");
    }
}
