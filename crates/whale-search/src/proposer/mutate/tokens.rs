//! Just enough of a JavaScript lexer to edit harness source safely: it tells code from
//! comments, string and template literals and regular expressions, so that an edit anchored
//! on a token (the `export ... solve` declaration, an instruction string) never lands inside
//! a comment or a string by accident. It never fails: unterminated constructs run to the end,
//! and a wrong guess only yields a candidate that fails validation and is dropped.

/// What a token is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenKind {
    /// An identifier or keyword.
    Word,
    /// A `'…'` or `"…"` literal.
    Quoted,
    /// A `` `…` `` literal; `substitutions` if it holds `${…}`.
    Template {
        substitutions: bool,
    },
    Regex,
    Number,
    /// One punctuation character (`(`, `=`, `.`…).
    Punct,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Token {
    pub kind: TokenKind,
    pub start: usize,
    pub end: usize,
}

impl Token {
    pub fn text<'s>(&self, source: &'s str) -> &'s str {
        &source[self.start..self.end]
    }

    pub fn is_word(&self, source: &str, word: &str) -> bool {
        self.kind == TokenKind::Word && self.text(source) == word
    }

    pub fn is_punct(&self, source: &str, punct: &str) -> bool {
        self.kind == TokenKind::Punct && self.text(source) == punct
    }

    /// The text between the quotes of a string or template literal (to the end of the token
    /// when the literal is unterminated).
    pub fn inner(&self, source: &str) -> (usize, usize) {
        let bytes = source.as_bytes();
        let closed = self.end >= self.start + 2 && bytes.get(self.end - 1) == bytes.get(self.start);
        (self.start + 1, if closed { self.end - 1 } else { self.end })
    }
}

/// Words after which a `/` starts a regular expression rather than a division.
const BEFORE_REGEX: [&str; 14] = [
    "return",
    "typeof",
    "case",
    "do",
    "else",
    "in",
    "of",
    "new",
    "delete",
    "void",
    "throw",
    "yield",
    "await",
    "instanceof",
];

/// The tokens of `source`, comments and whitespace left out.
pub(crate) fn tokenize(source: &str) -> Vec<Token> {
    let bytes = source.as_bytes();
    let mut tokens: Vec<Token> = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let start = i;
        let kind = match c {
            b' ' | b'\t' | b'\r' | b'\n' => {
                i += 1;
                continue;
            }
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                i = line_end(bytes, i);
                continue;
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i = find(bytes, i + 2, b"*/").map_or(bytes.len(), |end| end + 2);
                continue;
            }
            b'\'' | b'"' => {
                i = quoted_end(bytes, i);
                TokenKind::Quoted
            }
            b'`' => {
                let (end, substitutions) = template_end(bytes, i);
                i = end;
                TokenKind::Template { substitutions }
            }
            b'/' if regex_may_start(source, tokens.last()) => {
                i = regex_end(bytes, i);
                TokenKind::Regex
            }
            b'0'..=b'9' => {
                i = number_end(bytes, i);
                TokenKind::Number
            }
            _ if is_word_byte(c) => {
                i = word_end(bytes, i);
                TokenKind::Word
            }
            _ => {
                i += source[i..].chars().next().map_or(1, char::len_utf8);
                TokenKind::Punct
            }
        };
        tokens.push(Token { kind, start, end: i });
    }
    tokens
}

fn is_word_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c >= 0x80
}

fn word_end(bytes: &[u8], mut i: usize) -> usize {
    while i < bytes.len() && is_word_byte(bytes[i]) {
        i += 1;
    }
    i
}

fn number_end(bytes: &[u8], mut i: usize) -> usize {
    while i < bytes.len() && (is_word_byte(bytes[i]) || bytes[i] == b'.') {
        i += 1;
    }
    i
}

fn line_end(bytes: &[u8], i: usize) -> usize {
    bytes[i..].iter().position(|&b| b == b'\n').map_or(bytes.len(), |p| i + p)
}

fn find(bytes: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    bytes.get(from..)?.windows(needle.len()).position(|w| w == needle).map(|p| from + p)
}

/// The end (exclusive) of the quoted literal starting at `i`.
fn quoted_end(bytes: &[u8], i: usize) -> usize {
    let quote = bytes[i];
    let mut j = i + 1;
    while j < bytes.len() {
        match bytes[j] {
            b'\\' => j += 2,
            b'\n' => return j,
            c if c == quote => return j + 1,
            _ => j += 1,
        }
    }
    bytes.len()
}

/// The end (exclusive) of the template literal starting at `i`, and whether it has `${…}`.
fn template_end(bytes: &[u8], i: usize) -> (usize, bool) {
    let mut j = i + 1;
    let mut substitutions = false;
    while j < bytes.len() {
        match bytes[j] {
            b'\\' => j += 2,
            b'`' => return (j + 1, substitutions),
            b'$' if bytes.get(j + 1) == Some(&b'{') => {
                substitutions = true;
                j = substitution_end(bytes, j + 2);
            }
            _ => j += 1,
        }
    }
    (bytes.len(), substitutions)
}

/// The `${…}` substitutions of a template literal token's text, each with its braces.
pub(crate) fn substitutions(template: &str) -> Vec<&str> {
    let bytes = template.as_bytes();
    let mut found = Vec::new();
    let mut j = 1;
    while j < bytes.len() {
        match bytes[j] {
            b'\\' => j += 2,
            b'$' if bytes.get(j + 1) == Some(&b'{') => {
                let end = substitution_end(bytes, j + 2).min(bytes.len());
                found.push(&template[j..end]);
                j = end;
            }
            _ => j += 1,
        }
    }
    found
}

/// The end (exclusive) of a `${…}` substitution whose body starts at `i`.
fn substitution_end(bytes: &[u8], mut i: usize) -> usize {
    let mut depth = 0usize;
    while i < bytes.len() {
        match bytes[i] {
            b'{' => depth += 1,
            b'}' if depth == 0 => return i + 1,
            b'}' => depth -= 1,
            b'\'' | b'"' => {
                i = quoted_end(bytes, i);
                continue;
            }
            b'`' => {
                i = template_end(bytes, i).0;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    bytes.len()
}

fn regex_may_start(source: &str, previous: Option<&Token>) -> bool {
    match previous {
        None => true,
        Some(token) => match token.kind {
            TokenKind::Word => BEFORE_REGEX.contains(&token.text(source)),
            TokenKind::Punct => !matches!(token.text(source), ")" | "]"),
            _ => false,
        },
    }
}

/// The end (exclusive) of the regular expression starting at `i`, flags included.
fn regex_end(bytes: &[u8], i: usize) -> usize {
    let mut j = i + 1;
    let mut in_class = false;
    while j < bytes.len() {
        match bytes[j] {
            b'\\' => j += 1,
            b'[' => in_class = true,
            b']' => in_class = false,
            b'/' if !in_class => return word_end(bytes, j + 1),
            b'\n' => return j,
            _ => {}
        }
        j += 1;
    }
    bytes.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(source: &str) -> Vec<(TokenKind, &str)> {
        tokenize(source).iter().map(|t| (t.kind, t.text(source))).collect()
    }

    #[test]
    fn strings_templates_regexes_and_comments_are_told_apart() {
        let source = "// export function solve(\nconst a = 'x // y'; /* solve */ const r = /[/]\\//g.test(b) / 2;\n\
                      const t = `a ${ {k: `in ${1}`}.k } b`; export async function solve(task, ctx) {}";
        let tokens = kinds(source);
        assert!(tokens.contains(&(TokenKind::Quoted, "'x // y'")));
        assert!(tokens.contains(&(TokenKind::Regex, "/[/]\\//g")));
        assert!(tokens.contains(&(TokenKind::Template { substitutions: true }, "`a ${ {k: `in ${1}`}.k } b`")));
        assert_eq!(tokens.iter().filter(|(_, text)| *text == "solve").count(), 1);
        assert_eq!(tokens.iter().filter(|(_, text)| *text == "/").count(), 1, "the division stays a division");
    }

    #[test]
    fn unterminated_constructs_run_to_the_end_without_panicking() {
        for source in ["'abc", "`abc ${", "/* abc", "x = /abc", "\"a\\", "`${'`", "\"héllo wörld é\n", "'é"] {
            let tokens = tokenize(source);
            assert!(tokens.iter().all(|t| t.end <= source.len() && t.start < t.end), "{source}");
            for token in tokens.iter().filter(|t| matches!(t.kind, TokenKind::Quoted | TokenKind::Template { .. })) {
                let (start, end) = token.inner(source);
                assert!(source.get(start..end).is_some(), "{source}: {start}..{end}");
            }
        }
        assert_eq!(tokenize("'é'")[0].inner("'é'"), (1, 3));
    }
}
