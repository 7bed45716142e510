//! The synthetic pretraining corpus of the default base model: chat conversations built from
//! the three domains' task generators.
//!
//! The base model only ever sees what this corpus teaches, so the corpus decides which prompts
//! a harness can use. Each task is rendered in one of several styles — phrasings of the
//! request, formats of the worked answer (`####`, `\boxed{}`, "The answer is", step lists,
//! GSM8K `<<a*b=c>>` annotations), multi-turn tool transcripts (a calculator for math, a search
//! tool for QA, move-by-move play for chess) — so harness search has real alternatives to
//! choose between. In the math model's corpus math dominates, with a little chess and QA; the
//! chess and QA models' corpora hold their own domain only, with the extended styles
//! ([`CorpusSpec::extended_styles`]). Everything is a pure function of the seed.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;
use std::collections::HashSet;
use whale_core::{ChatMessage, Domain, Task};
use whale_tasks::chess::{self, ChessConfig};
use whale_tasks::qa::QaPayload;
use whale_tasks::{math, qa, Episode};

/// The instruction the plain one-call math prompt appends to the question.
pub const PLAIN_MATH_INSTRUCTION: &str = "Give the final answer after ####.";

/// The default plain prompt for a math question: the question, a newline and
/// [`PLAIN_MATH_INSTRUCTION`], as the only (user) message. Its reply is a worked solution, one
/// `Description: expression = value.` line per step, ending with `#### answer`.
pub fn plain_math_prompt(question: &str) -> String {
    format!("{question}\n{PLAIN_MATH_INSTRUCTION}")
}

/// How a corpus is put together; every field changes the corpus, so it is part of the model's
/// identity.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CorpusSpec {
    /// Number of conversations.
    pub conversations: usize,
    /// Shares of the three domains (normalised).
    pub math_share: f64,
    pub chess_share: f64,
    pub qa_share: f64,
    /// Math difficulties drawn from, each with the given relative weight.
    pub math_difficulties: Vec<(u32, f64)>,
    /// The chess generator's difficulties of a mate in one (60% of the puzzles) and of a mate
    /// in two: endgames (1, 2) or positions from random play (3, 4).
    #[serde(default = "random_play")]
    pub chess_difficulties: [u32; 2],
    /// The styles added for the single-domain models: chess legal moves in SAN, and QA's
    /// "repeat the passage about X" (dense copying, from which a small model learns to copy
    /// names out of passages). Off in the math recipe, whose corpus stays as it was.
    #[serde(default)]
    pub extended_styles: bool,
    /// Every QA answer (and every passage a recall drill repeats) starts with a space, so an
    /// answer copied out of a passage is spelt with the passage's tokens: byte-level BPE splits
    /// a word at the start of a text differently from the same word after a space (`V ael
    /// thor` against `ĠV ael thor`, `19 5 3` against `Ġ1953`), and a model copying from its
    /// prompt would first have to translate. Off in the math recipe, whose corpus stays as it
    /// was.
    #[serde(default)]
    pub spaced_answers: bool,
    /// Tasks never put in the corpus (the held-out evaluation tasks), by [`identity`].
    #[serde(skip)]
    pub held_out: HashSet<String>,
}

fn random_play() -> [u32; 2] {
    [3, 4]
}

/// One training conversation: alternating turns ending with an assistant turn.
#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    pub domain: Domain,
    /// The rendering style, for statistics and tests.
    pub style: &'static str,
    pub messages: Vec<ChatMessage>,
}

/// Builds the corpus for `seed`: the same spec and seed always give the same conversations in
/// the same order.
pub fn build(spec: &CorpusSpec, seed: u64) -> Vec<Conversation> {
    let total_share = spec.math_share + spec.chess_share + spec.qa_share;
    let count = |share: f64| ((share / total_share) * spec.conversations as f64).round() as usize;
    let (chess_count, qa_count) = (count(spec.chess_share), count(spec.qa_share));
    let math_count = spec.conversations.saturating_sub(chess_count + qa_count);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut corpus = math_conversations(spec, math_count, seed, &mut rng);
    corpus.extend(chess_conversations(spec, chess_count, seed, &mut rng));
    corpus.extend(qa_conversations(spec, qa_count, seed, &mut rng));
    corpus.shuffle(&mut rng);
    corpus
}

/// A seed for one generator call, distinct per (corpus seed, domain, part).
fn sub_seed(seed: u64, domain: u64, part: u64) -> u64 {
    seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (domain << 56) ^ part.wrapping_mul(0xD1B5_4A32_D192_ED03)
}

fn user(content: impl Into<String>) -> ChatMessage {
    ChatMessage::new("user", content)
}

fn assistant(content: impl Into<String>) -> ChatMessage {
    ChatMessage::new("assistant", content)
}

fn system(content: impl Into<String>) -> ChatMessage {
    ChatMessage::new("system", content)
}

fn text_field<'a>(task: &'a Task, field: &str) -> Option<&'a str> {
    task.payload.get(field).and_then(Value::as_str)
}

/// What identifies a task in the corpus: a chess puzzle's starting FEN, any other task's
/// question.
pub fn identity(task: &Task) -> Option<String> {
    let field = match task.domain {
        Domain::Chess => "fen",
        Domain::Math | Domain::Qa => "question",
    };
    text_field(task, field).map(str::to_string)
}

fn held_out(spec: &CorpusSpec, task: &Task) -> bool {
    identity(task).is_some_and(|key| spec.held_out.contains(&key))
}

/// Picks an item by relative weight (`None` only from an empty list).
fn weighted<T: Copy>(rng: &mut ChaCha8Rng, items: &[(T, f64)]) -> Option<T> {
    let total: f64 = items.iter().map(|(_, w)| w).sum();
    let mut target = rng.gen::<f64>() * total;
    for &(item, weight) in items {
        if target < weight {
            return Some(item);
        }
        target -= weight;
    }
    items.last().map(|&(item, _)| item)
}

/// Collects `count` conversations from successive generator calls (parts 0, 1, ...), each
/// asked for what is still missing, at most `chunk`. Gives up after `count + 1` calls, so a
/// generator that yields nothing (every task excluded) cannot loop forever.
fn fill(count: usize, chunk: usize, mut part: impl FnMut(u64, usize) -> Vec<Conversation>) -> Vec<Conversation> {
    let mut conversations = Vec::with_capacity(count);
    for index in 0..=count as u64 {
        if conversations.len() >= count {
            break;
        }
        conversations.extend(part(index, (count - conversations.len()).min(chunk)));
    }
    conversations.truncate(count);
    conversations
}

// ---------------------------------------------------------------------------------------------
// Math

/// One worked step of a generated solution: `Description: expression = value.`
#[derive(Debug, Clone, PartialEq)]
struct MathStep {
    description: String,
    expression: String,
    value: String,
}

/// A generated problem with its steps read back from the worked solution.
struct MathProblem {
    question: String,
    answer: String,
    steps: Vec<MathStep>,
    solution: String,
}

impl MathProblem {
    fn from_task(task: &Task) -> Option<Self> {
        let solution = text_field(task, "solution")?.to_string();
        let steps = solution.lines().filter(|line| !line.starts_with("####")).map(parse_step).collect::<Option<_>>()?;
        Some(Self {
            question: text_field(task, "question")?.to_string(),
            answer: text_field(task, "answer")?.to_string(),
            steps,
            solution,
        })
    }
}

fn parse_step(line: &str) -> Option<MathStep> {
    let (description, rest) = line.split_once(": ")?;
    let (expression, value) = rest.rsplit_once(" = ")?;
    Some(MathStep {
        description: description.to_string(),
        expression: expression.to_string(),
        value: value.trim_end_matches('.').to_string(),
    })
}

/// The math renderings and their relative frequencies; `Plain` is the default prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MathStyle {
    Plain,
    BareQuestion,
    StepByStep,
    Boxed,
    Tutor,
    AnswerOnly,
    QuestionAnswer,
    Annotated,
    Calculator,
    Check,
}

const MATH_STYLES: [(MathStyle, f64); 10] = [
    (MathStyle::Plain, 26.0),
    (MathStyle::BareQuestion, 8.0),
    (MathStyle::StepByStep, 12.0),
    (MathStyle::Boxed, 12.0),
    (MathStyle::Tutor, 7.0),
    (MathStyle::AnswerOnly, 4.0),
    (MathStyle::QuestionAnswer, 7.0),
    (MathStyle::Annotated, 7.0),
    (MathStyle::Calculator, 5.0),
    (MathStyle::Check, 5.0),
];

impl MathStyle {
    fn name(self) -> &'static str {
        match self {
            MathStyle::Plain => "math/plain",
            MathStyle::BareQuestion => "math/bare-question",
            MathStyle::StepByStep => "math/step-by-step",
            MathStyle::Boxed => "math/boxed",
            MathStyle::Tutor => "math/tutor",
            MathStyle::AnswerOnly => "math/answer-only",
            MathStyle::QuestionAnswer => "math/question-answer",
            MathStyle::Annotated => "math/annotated",
            MathStyle::Calculator => "math/calculator",
            MathStyle::Check => "math/check",
        }
    }
}

/// The system prompt of the calculator transcripts; the tool protocol it describes is
/// `CALC: <expression>` from the assistant, `RESULT: <value>` back as a user turn.
pub const CALCULATOR_INSTRUCTION: &str = "You can use a calculator. To use it, reply with one line \
`CALC: <expression>` and wait for `RESULT: <value>`. When you are done, give the final answer after ####.";

/// Math conversations; none when `spec` lists no difficulty.
fn math_conversations(spec: &CorpusSpec, count: usize, seed: u64, rng: &mut ChaCha8Rng) -> Vec<Conversation> {
    fill(count, 64, |part, chunk| {
        let Some(difficulty) = weighted(rng, &spec.math_difficulties) else { return Vec::new() };
        let mut conversations = Vec::new();
        for task in math::generate(chunk, sub_seed(seed, 1, part), difficulty) {
            let Some(problem) = MathProblem::from_task(&task).filter(|_| !held_out(spec, &task)) else { continue };
            let style = weighted(rng, &MATH_STYLES).unwrap_or(MathStyle::Plain);
            let messages = render_math(&problem, style, rng);
            conversations.push(Conversation { domain: Domain::Math, style: style.name(), messages });
        }
        conversations
    })
}

fn render_math(problem: &MathProblem, style: MathStyle, rng: &mut ChaCha8Rng) -> Vec<ChatMessage> {
    let (question, answer) = (&problem.question, &problem.answer);
    let steps = &problem.steps;
    match style {
        MathStyle::Plain => vec![user(plain_math_prompt(question)), assistant(&problem.solution)],
        MathStyle::BareQuestion => vec![user(question), assistant(&problem.solution)],
        MathStyle::StepByStep => {
            let mut lines: Vec<String> = steps
                .iter()
                .enumerate()
                .map(|(i, s)| format!("Step {}: {}: {} = {}.", i + 1, s.description, s.expression, s.value))
                .collect();
            lines.push(format!("So the answer is {answer}."));
            vec![user(format!("{question}\nLet's think step by step.")), assistant(lines.join("\n"))]
        }
        MathStyle::Boxed => {
            let mut lines = step_lines(steps);
            lines.push(format!("The final answer is $\\boxed{{{answer}}}$."));
            let ask = format!("{question}\nPut your final answer within \\boxed{{}}.");
            vec![user(ask), assistant(lines.join("\n"))]
        }
        MathStyle::Tutor => vec![
            system("You are a patient math tutor. Solve the problem one step per line, then write the final answer after ####."),
            user(question),
            assistant(&problem.solution),
        ],
        MathStyle::AnswerOnly => {
            vec![user(format!("{question}\nReply with the final number only.")), assistant(answer)]
        }
        MathStyle::QuestionAnswer => {
            let work: Vec<String> = steps.iter().map(|s| format!("{} = {}", s.expression, s.value)).collect();
            let reply = format!("We compute {}. The answer is {answer}.", work.join(", then "));
            vec![user(format!("Question: {question}\nAnswer:")), assistant(reply)]
        }
        MathStyle::Annotated => {
            let mut lines: Vec<String> = steps
                .iter()
                .map(|s| format!("{}: <<{}={}>>{}.", s.description, s.expression.replace(' ', ""), s.value, s.value))
                .collect();
            lines.push(format!("#### {answer}"));
            let ask = format!("{question}\nShow each calculation as <<expression=result>> and end with #### and the answer.");
            vec![user(ask), assistant(lines.join("\n"))]
        }
        MathStyle::Calculator => calculator_transcript(problem),
        MathStyle::Check => {
            let correct = rng.gen_bool(0.5);
            let proposed = if correct { answer.clone() } else { wrong_answer(answer, rng) };
            let ask = format!("{question}\nProposed answer: {proposed}\nIs the proposed answer correct? Reply yes or no.");
            vec![user(ask), assistant(if correct { "yes" } else { "no" })]
        }
    }
}

fn step_lines(steps: &[MathStep]) -> Vec<String> {
    steps.iter().map(|s| format!("{}: {} = {}.", s.description, s.expression, s.value)).collect()
}

/// The calculator protocol: one `CALC:` turn per step, the result as a user turn, and a final
/// turn with the answer.
fn calculator_transcript(problem: &MathProblem) -> Vec<ChatMessage> {
    let mut messages = vec![system(CALCULATOR_INSTRUCTION), user(&problem.question)];
    for step in &problem.steps {
        messages.push(assistant(format!("{}: CALC: {}", step.description, step.expression)));
        messages.push(user(format!("RESULT: {}", step.value)));
    }
    messages.push(assistant(format!("#### {}", problem.answer)));
    messages
}

/// A plausible wrong answer: the right one moved by a small non-zero amount.
fn wrong_answer(answer: &str, rng: &mut ChaCha8Rng) -> String {
    match answer.parse::<i64>() {
        Ok(value) => {
            let delta = *[-10, -2, -1, 1, 2, 10].choose(rng).unwrap_or(&1);
            (value + delta).to_string()
        }
        Err(_) => format!("{answer}0"),
    }
}

// ---------------------------------------------------------------------------------------------
// Chess

/// A puzzle seen through its episode: what each solver move faced.
struct ChessTurn {
    observation: String,
    fen: String,
    board: String,
    side: String,
    legal_uci: Vec<String>,
    /// The same moves in SAN, whose `+` and `#` mark checks and mates.
    legal_san: Vec<String>,
    /// The opponent's move just before this turn, in UCI.
    last_uci: String,
    /// The solver's stored move, in UCI and in SAN.
    best_uci: String,
    best_san: String,
}

fn chess_turns(task: &Task) -> Option<Vec<ChessTurn>> {
    let mut episode = chess::episode(task, &ChessConfig::default()).ok()?;
    let mut turns = Vec::new();
    for best in chess::gold_actions(task) {
        let tool = |episode: &mut chess::ChessEpisode, name: &str| episode.call_tool(name, &[]).ok();
        let legal = tool(&mut episode, "legal_moves")?;
        let moves = |notation: &str| -> Option<Vec<String>> {
            Some(legal.get(notation)?.as_array()?.iter().filter_map(|m| m.as_str().map(str::to_string)).collect())
        };
        let (legal_uci, legal_san) = (moves("uci")?, moves("san")?);
        let best_san = legal_san.get(legal_uci.iter().position(|m| *m == best)?)?.clone();
        let last = tool(&mut episode, "last_move")?;
        turns.push(ChessTurn {
            observation: episode.observation(),
            fen: episode.fen(),
            board: tool(&mut episode, "board")?.as_str()?.to_string(),
            side: tool(&mut episode, "side_to_move")?.as_str()?.to_string(),
            legal_uci,
            legal_san,
            last_uci: last.get("uci")?.as_str()?.to_string(),
            best_uci: best.clone(),
            best_san,
        });
        if episode.act(&best).done {
            break;
        }
    }
    Some(turns)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChessStyle {
    LegalMoves,
    SanMoves,
    Observation,
    Board,
    ListMoves,
}

/// The chess styles of the math recipe's corpus.
const CHESS_STYLES: [(ChessStyle, f64); 4] = [
    (ChessStyle::LegalMoves, 4.0),
    (ChessStyle::Observation, 2.0),
    (ChessStyle::Board, 1.0),
    (ChessStyle::ListMoves, 2.0),
];

/// The chess styles of the chess model's corpus ([`CorpusSpec::extended_styles`]).
const EXTENDED_CHESS_STYLES: [(ChessStyle, f64); 5] = [
    (ChessStyle::LegalMoves, 4.0),
    (ChessStyle::SanMoves, 3.0),
    (ChessStyle::Observation, 1.5),
    (ChessStyle::Board, 0.5),
    (ChessStyle::ListMoves, 1.0),
];

impl ChessStyle {
    fn name(self) -> &'static str {
        match self {
            ChessStyle::LegalMoves => "chess/legal-moves",
            ChessStyle::SanMoves => "chess/san-moves",
            ChessStyle::Observation => "chess/observation",
            ChessStyle::Board => "chess/board",
            ChessStyle::ListMoves => "chess/list-moves",
        }
    }
}

fn chess_conversations(spec: &CorpusSpec, count: usize, seed: u64, rng: &mut ChaCha8Rng) -> Vec<Conversation> {
    fill(count, 32, |part, chunk| {
        let [one, two] = spec.chess_difficulties;
        let difficulty = if rng.gen_bool(0.6) { one } else { two };
        let mut conversations = Vec::new();
        for task in chess::generate(chunk, sub_seed(seed, 2, part), difficulty) {
            if held_out(spec, &task) {
                continue;
            }
            let Some(turns) = chess_turns(&task).filter(|turns| !turns.is_empty()) else { continue };
            let styles: &[_] = if spec.extended_styles { &EXTENDED_CHESS_STYLES } else { &CHESS_STYLES };
            let style = weighted(rng, styles).unwrap_or(ChessStyle::LegalMoves);
            let messages = render_chess(&turns, style);
            conversations.push(Conversation { domain: Domain::Chess, style: style.name(), messages });
        }
        conversations
    })
}

fn render_chess(turns: &[ChessTurn], style: ChessStyle) -> Vec<ChatMessage> {
    let mate_in = turns.len();
    let mut messages = Vec::new();
    for (index, turn) in turns.iter().enumerate() {
        let first = index == 0;
        let ask = match style {
            ChessStyle::LegalMoves | ChessStyle::SanMoves => {
                let opening = if first {
                    format!("Chess puzzle: {} to move and mate in {mate_in}.", turn.side)
                } else {
                    format!("The opponent replied {}.", turn.last_uci)
                };
                let (label, moves, notation) = match style {
                    ChessStyle::SanMoves => ("Legal moves (SAN)", &turn.legal_san, "SAN"),
                    _ => ("Legal moves", &turn.legal_uci, "UCI"),
                };
                format!(
                    "{opening}\nFEN: {}\n{label}: {}\nReply with the best move in {notation}.",
                    turn.fen,
                    moves.join(" ")
                )
            }
            ChessStyle::Observation => {
                let opening = if first { String::new() } else { format!("The opponent replied {}.\n", turn.last_uci) };
                format!("{opening}{}\nReply with your move in UCI (like e2e4).", turn.observation)
            }
            ChessStyle::Board => {
                format!(
                    "{}\n{} to move; the last move was {}. Find the strongest move.",
                    turn.board, turn.side, turn.last_uci
                )
            }
            ChessStyle::ListMoves => {
                let ask = format!("FEN: {}\nList every legal move in UCI.", turn.fen);
                return vec![user(ask), assistant(turn.legal_uci.join(" "))];
            }
        };
        messages.push(user(ask));
        let reply = match style {
            ChessStyle::Board => format!("Best move: {}", turn.best_uci),
            ChessStyle::SanMoves => turn.best_san.clone(),
            _ => turn.best_uci.clone(),
        };
        messages.push(assistant(reply));
    }
    messages
}

// ---------------------------------------------------------------------------------------------
// QA

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QaStyle {
    Passages,
    ShortForm,
    Search,
    Recall,
}

/// The QA styles of the math recipe's corpus.
const QA_STYLES: [(QaStyle, f64); 3] = [(QaStyle::Passages, 4.0), (QaStyle::ShortForm, 2.0), (QaStyle::Search, 3.0)];

/// The QA styles of the QA model's corpus ([`CorpusSpec::extended_styles`]).
const EXTENDED_QA_STYLES: [(QaStyle, f64); 4] =
    [(QaStyle::Passages, 4.0), (QaStyle::ShortForm, 2.0), (QaStyle::Search, 3.0), (QaStyle::Recall, 3.0)];

impl QaStyle {
    fn name(self) -> &'static str {
        match self {
            QaStyle::Passages => "qa/passages",
            QaStyle::ShortForm => "qa/short-form",
            QaStyle::Search => "qa/search",
            QaStyle::Recall => "qa/recall",
        }
    }
}

/// The system prompt of the search transcripts: `SEARCH: <query>` from the assistant,
/// `RESULTS:` with passages back as a user turn, then the short answer.
pub const SEARCH_INSTRUCTION: &str = "You can search a collection of passages. To search, reply with one \
line `SEARCH: <query>` and wait for the RESULTS. Answer with the short answer only.";

/// Passages shown with a QA question: the supporting ones plus distractors.
const QA_PASSAGES: usize = 3;

fn qa_conversations(spec: &CorpusSpec, count: usize, seed: u64, rng: &mut ChaCha8Rng) -> Vec<Conversation> {
    fill(count, 64, |part, chunk| {
        let difficulty = if rng.gen_bool(0.7) { 1 } else { 3 };
        let mut conversations = Vec::new();
        for task in qa::generate(chunk, sub_seed(seed, 3, part), difficulty) {
            if held_out(spec, &task) {
                continue;
            }
            let Ok(payload) = QaPayload::from_task(&task) else { continue };
            let Some(answer) = payload.answers.first() else { continue };
            let styles: &[_] = if spec.extended_styles { &EXTENDED_QA_STYLES } else { &QA_STYLES };
            let style = weighted(rng, styles).unwrap_or(QaStyle::Passages);
            let reply = if spec.spaced_answers { format!(" {answer}") } else { answer.clone() };
            let messages = render_qa(&payload, &reply, style, spec.spaced_answers, rng);
            conversations.push(Conversation { domain: Domain::Qa, style: style.name(), messages });
        }
        conversations
    })
}

fn passage_text(paragraphs: &[&qa::ContextParagraph]) -> String {
    paragraphs.iter().map(|p| format!("[{}] {}", p.title, p.text)).collect::<Vec<_>>().join("\n")
}

/// One QA conversation; `answer` is the reply as written, `spaced` puts a space before the
/// other replies too (the passage a recall drill repeats).
fn render_qa(
    payload: &QaPayload,
    answer: &str,
    style: QaStyle,
    spaced: bool,
    rng: &mut ChaCha8Rng,
) -> Vec<ChatMessage> {
    let supporting: Vec<&qa::ContextParagraph> = payload
        .supporting_titles
        .iter()
        .filter_map(|title| payload.context.iter().find(|p| &p.title == title))
        .collect();
    let mut distractors: Vec<&qa::ContextParagraph> =
        payload.context.iter().filter(|p| !payload.supporting_titles.contains(&p.title)).collect();
    distractors.shuffle(rng);
    let question = &payload.question;
    match style {
        QaStyle::Recall => {
            let mut shown: Vec<&qa::ContextParagraph> = supporting.iter().take(1).copied().collect();
            let Some(wanted) = shown.first().copied() else { return vec![user(question), assistant(answer)] };
            shown.extend(distractors.iter().take(QA_PASSAGES - 1));
            shown.shuffle(rng);
            let ask = format!("{}\nRepeat the passage about {}.", passage_text(&shown), wanted.title);
            let repeated = if spaced { format!(" {}", wanted.text) } else { wanted.text.clone() };
            vec![user(ask), assistant(repeated)]
        }
        QaStyle::Passages | QaStyle::ShortForm => {
            let mut shown: Vec<&qa::ContextParagraph> = supporting.clone();
            shown.extend(distractors.iter().take(QA_PASSAGES.saturating_sub(supporting.len())));
            shown.shuffle(rng);
            let passages = passage_text(&shown);
            let ask = if style == QaStyle::Passages {
                format!("Answer the question using the passages.\n{passages}\nQuestion: {question}")
            } else {
                format!("{passages}\nQ: {question}\nA:")
            };
            vec![user(ask), assistant(answer)]
        }
        QaStyle::Search => {
            let mut messages = vec![system(SEARCH_INSTRUCTION), user(question)];
            for (hop, found) in supporting.iter().enumerate() {
                let mut results = vec![*found];
                results.extend(distractors.get(hop));
                results.shuffle(rng);
                messages.push(assistant(format!("SEARCH: {}", found.title)));
                messages.push(user(format!("RESULTS:\n{}", passage_text(&results))));
            }
            messages.push(assistant(answer));
            messages
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(conversations: usize) -> CorpusSpec {
        CorpusSpec {
            conversations,
            math_share: 0.75,
            chess_share: 0.1,
            qa_share: 0.15,
            math_difficulties: vec![(1, 1.0), (2, 1.0)],
            chess_difficulties: [1, 2],
            extended_styles: true,
            spaced_answers: false,
            held_out: HashSet::new(),
        }
    }

    #[test]
    fn the_corpus_is_deterministic_per_seed_and_covers_every_domain() {
        let a = build(&spec(300), 7);
        assert_eq!(a, build(&spec(300), 7));
        assert_ne!(a, build(&spec(300), 8));
        assert_eq!(a.len(), 300);
        for domain in [Domain::Math, Domain::Chess, Domain::Qa] {
            let n = a.iter().filter(|c| c.domain == domain).count();
            assert!(n >= 20, "{domain}: {n}");
        }
        let math = a.iter().filter(|c| c.domain == Domain::Math).count();
        assert!(math > 200, "math should dominate: {math}");
    }

    #[test]
    fn a_single_domain_corpus_holds_only_that_domain_and_is_deterministic() {
        for (domain, shares) in [(Domain::Chess, (0.0, 1.0, 0.0)), (Domain::Qa, (0.0, 0.0, 1.0))] {
            let spec = CorpusSpec { math_share: shares.0, chess_share: shares.1, qa_share: shares.2, ..spec(120) };
            let corpus = build(&spec, 5);
            assert_eq!(corpus.len(), 120);
            assert!(corpus.iter().all(|c| c.domain == domain));
            assert_eq!(corpus, build(&spec, 5));
            assert_ne!(corpus, build(&spec, 6));
        }
    }

    #[test]
    fn spaced_qa_answers_are_spelt_as_in_their_passages() {
        let qa_only = CorpusSpec { math_share: 0.0, chess_share: 0.0, qa_share: 1.0, ..spec(300) };
        let spaced = build(&CorpusSpec { spaced_answers: true, ..qa_only.clone() }, 4);
        let mut checked = 0;
        for conversation in spaced.iter().filter(|c| c.style == "qa/passages" || c.style == "qa/short-form") {
            let [question, reply] = &conversation.messages[..] else { panic!("{:?}", conversation.messages) };
            assert!(reply.content.starts_with(' ') && !reply.content.starts_with("  "), "{:?}", reply.content);
            assert!(question.content.contains(&reply.content), "{:?} not in {}", reply.content, question.content);
            checked += 1;
        }
        assert!(checked > 100, "{checked}");
        for conversation in spaced.iter().filter(|c| c.style == "qa/recall" || c.style == "qa/search") {
            assert!(conversation.messages.last().is_some_and(|m| m.content.starts_with(' ')), "{}", conversation.style);
        }
        let plain = build(&qa_only, 4);
        assert!(plain.iter().all(|c| c.messages.iter().all(|m| !m.content.starts_with(' '))));
        assert_eq!(plain.len(), spaced.len());
    }

    #[test]
    fn every_conversation_ends_with_an_assistant_turn_and_alternates() {
        for conversation in build(&spec(400), 3) {
            let roles: Vec<&str> = conversation.messages.iter().map(|m| m.role.as_str()).collect();
            assert_eq!(roles.last(), Some(&"assistant"), "{}", conversation.style);
            let turns: Vec<&&str> = roles.iter().filter(|r| **r != "system").collect();
            for pair in turns.windows(2) {
                assert_ne!(pair[0], pair[1], "{}: {roles:?}", conversation.style);
            }
            assert!(conversation.messages.iter().all(|m| !m.content.is_empty()), "{}", conversation.style);
        }
    }

    #[test]
    fn math_replies_are_right_in_every_answering_style() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for task in math::generate(20, 5, 2) {
            let problem = MathProblem::from_task(&task).expect("a generated task parses");
            assert!(problem.steps.len() >= 2);
            for (style, _) in MATH_STYLES {
                let messages = render_math(&problem, style, &mut rng);
                let reply = &messages.last().expect("a reply").content;
                match style {
                    MathStyle::Check => assert!(reply == "yes" || reply == "no"),
                    MathStyle::Calculator => assert_eq!(reply, &format!("#### {}", problem.answer)),
                    _ => assert!(math::score(&task, reply).success, "{}: {reply}", style.name()),
                }
            }
        }
    }

    #[test]
    fn calculator_transcripts_use_expressions_the_calculator_accepts() {
        let corpus = build(&spec(400), 11);
        let transcript = corpus.iter().find(|c| c.style == "math/calculator").expect("a calculator transcript");
        let calls =
            transcript.messages.iter().filter(|m| m.role == "assistant").filter_map(|m| m.content.split_once("CALC: "));
        let results = transcript.messages.iter().filter_map(|m| m.content.strip_prefix("RESULT: "));
        let mut n = 0;
        for ((_, expression), result) in calls.zip(results) {
            assert_eq!(math::calculate(expression).expect("calculable").to_string(), result);
            n += 1;
        }
        assert!(n >= 2);
    }

    #[test]
    fn chess_replies_are_the_stored_solutions_and_legal() {
        let corpus = build(&spec(600), 13);
        let styles: HashSet<&str> = corpus.iter().map(|c| c.style).collect();
        assert!(styles.contains("chess/san-moves") && styles.contains("chess/legal-moves"), "{styles:?}");
        for conversation in corpus.iter().filter(|c| c.domain == Domain::Chess && c.style != "chess/list-moves") {
            let replies: Vec<&str> =
                conversation.messages.iter().filter(|m| m.role == "assistant").map(|m| m.content.as_str()).collect();
            for pair in conversation.messages.windows(2).filter(|p| p[1].role == "assistant") {
                let reply = pair[1].content.trim_start_matches("Best move: ");
                let listed = pair[0]
                    .content
                    .lines()
                    .find_map(|line| line.split_once("moves: ").or_else(|| line.split_once("(SAN): ")));
                if let Some((_, moves)) = listed {
                    assert!(moves.split(' ').any(|m| m == reply), "{reply} not in {moves}");
                }
                if conversation.style != "chess/san-moves" {
                    assert!((4..=5).contains(&reply.len()), "{reply}");
                }
            }
            if conversation.style == "chess/san-moves" {
                assert!(replies.last().is_some_and(|r| r.ends_with('#')), "the last solver move mates: {replies:?}");
            }
        }
    }

    #[test]
    fn degenerate_specs_end_instead_of_looping() {
        let mut no_difficulty = spec(50);
        no_difficulty.math_difficulties.clear();
        let corpus = build(&no_difficulty, 1);
        assert!(corpus.iter().all(|c| c.domain != Domain::Math));
        assert!(!corpus.is_empty());
        let mut everything_excluded = spec(20);
        everything_excluded.math_share = 1.0;
        everything_excluded.chess_share = 0.0;
        everything_excluded.qa_share = 0.0;
        everything_excluded.math_difficulties = vec![(1, 1.0)];
        let questions = (0..21).flat_map(|part| math::generate(64, sub_seed(1, 1, part), 1));
        everything_excluded.held_out =
            questions.filter_map(|t| text_field(&t, "question").map(str::to_string)).collect();
        assert!(build(&everything_excluded, 1).is_empty());
    }

    #[test]
    fn excluded_questions_never_appear() {
        let mut spec = spec(200);
        let first = build(&spec, 2);
        let question = first.iter().find(|c| c.style == "math/plain").expect("a plain one").messages[0]
            .content
            .trim_end_matches(PLAIN_MATH_INSTRUCTION)
            .trim_end()
            .to_string();
        spec.held_out.insert(question.clone());
        let second = build(&spec, 2);
        assert!(second.iter().all(|c| c.messages.iter().all(|m| !m.content.contains(&question))));
    }
}
