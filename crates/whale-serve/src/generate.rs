//! Generation requests run against a served [`LocalPolicy`]: all choices at once (the engine
//! batches them, and the request's one worker thread waits on all: a thread per choice would let
//! a few requests of `n` = 128 start thousands), answered whole or streamed as server-sent
//! events while the engine samples.
//!
//! Streaming sends each token's text as soon as its characters are complete, except that the
//! last `longest stop string - 1` bytes are held back (they may turn out to begin a stop
//! string) and nothing from a completed stop string on is sent: text after the cut must never
//! reach the client. The streamed pieces therefore always add up to the final completion's text.

use std::time::{Duration, Instant};

use hyper::body::Bytes;
use serde_json::Value;
use tokio::sync::mpsc::error::TrySendError;
use whale_engine::sampling::StopMatcher;
use whale_engine::{ChoiceEvent, LocalPolicy};
use whale_policy::{Completion, PolicyError};

use crate::error::ApiError;
use crate::request::{Endpoint, GenerationRequest, Prompt};
use crate::response::{ChunkUpdate, ReplyHeader, TOOL_CALLS_FINISH};
use crate::tools::{ToolRequest, CALL_START};
use whale_text::{TextStream, Tokenizer};

/// The prompt's token ids: messages through the model's chat template (with the request's tools,
/// and the assistant turn opened inside a call where `tool_choice` asks for one), text through
/// its tokenizer, ids as given. Tools for a model whose template has no tools part are a 400.
pub fn prompt_ids(policy: &LocalPolicy, request: &GenerationRequest) -> Result<Vec<u32>, ApiError> {
    let field = request.endpoint.prompt_field();
    if let Some(tools) = request.tools.as_ref().filter(|tools| tools.rendered().is_some()) {
        let renders = policy.template_renders_tools().map_err(|error| ApiError::from_policy(error, field))?;
        if !renders {
            let message = "`tools` need a model whose chat template renders them (Qwen2.5's, Qwen3's); \
                           this model's template has no tools part";
            return Err(ApiError::bad_request(message).with_param("tools"));
        }
        if let Prompt::Messages(messages) = &request.prompt {
            let ids = policy.tool_prompt_ids(messages, tools.rendered(), &tools.opening());
            return ids.map_err(|error| ApiError::from_policy(error, field));
        }
    }
    match &request.prompt {
        Prompt::Messages(messages) => policy.prompt_ids(messages),
        Prompt::Text(text) => policy.tokenizer().encode(text).map_err(PolicyError::from),
        Prompt::Ids(ids) => Ok(ids.clone()),
    }
    .map_err(|error| ApiError::from_policy(error, field))
}

/// Every choice of `request`, generated concurrently (the engine batches them; this thread
/// waits on all); none starts once `stop_now` says so (its client hung up, the server stops),
/// and each stops at its next token when it does (the answer is then
/// [`PolicyError::Cancelled`], which the caller replaces). The first choice to fail stops the others.
pub fn complete(
    policy: &LocalPolicy,
    request: &GenerationRequest,
    prompt: &[u32],
    stop_now: &dyn Fn() -> bool,
) -> Result<Vec<Completion>, ApiError> {
    let field = request.endpoint.prompt_field();
    if stop_now() {
        return Err(ApiError::from_policy(PolicyError::Cancelled, field));
    }
    let mut completions: Vec<Option<Completion>> = vec![None; request.n];
    let mut failure = None;
    let outcome = policy.generate_choices(prompt.to_vec(), &request.choices(), &mut |event| match event {
        ChoiceEvent::Token { .. } => !stop_now(),
        ChoiceEvent::Done { index, outcome: Ok(completion) } => {
            completions[index] = Some(completion);
            true
        }
        ChoiceEvent::Done { outcome: Err(error), .. } => {
            failure = Some(error);
            false
        }
    });
    match (failure, outcome) {
        (Some(error), _) | (None, Err(error)) => Err(ApiError::from_policy(error, field)),
        (None, Ok(())) => Ok(completions.into_iter().flatten().collect()),
    }
}

/// Streams every choice of `request` to `sink` as the engine samples them, then the usage
/// (when asked for) and `[DONE]`. A client that goes away stops the writing and, at each
/// choice's next token, its generation; so does `cut_off` (the server stops), which ends the
/// stream with a 503's error event.
pub fn stream(
    policy: &LocalPolicy,
    request: &GenerationRequest,
    prompt: &[u32],
    header: &ReplyHeader,
    mut sink: EventSink,
    cut_off: &dyn Fn() -> bool,
) {
    let tokenizer = policy.tokenizer();
    for index in 0..request.n {
        let first = ChunkUpdate { first: true, ..ChunkUpdate::default() };
        if request.endpoint == Endpoint::Chat {
            sink.send(&header.chunk(index, first, tokenizer, request.logprobs));
        }
    }
    let mut completions: Vec<Option<Completion>> = vec![None; request.n];
    let mut failure = None;
    let tools = request.tools.as_ref().filter(|tools| tools.parses());
    let mut texts: Vec<ChoiceText> = (0..request.n)
        .map(|_| ChoiceText::new(tokenizer, policy.eos_token_ids(), &request.params.stop, tools))
        .collect();
    let outcome = policy.generate_choices(prompt.to_vec(), &request.choices(), &mut |event| {
        match event {
            ChoiceEvent::Token { index, token } => {
                let text = texts[index].push(token.id);
                let update = ChunkUpdate {
                    text: &text,
                    token_ids: &[token.id],
                    logprobs: &[token.logprob],
                    ..ChunkUpdate::default()
                };
                sink.send(&header.chunk(index, update, tokenizer, request.logprobs));
            }
            ChoiceEvent::Done { index, outcome: Ok(completion) } => {
                for update in texts[index].last_updates(&completion) {
                    let update = ChunkUpdate {
                        text: &update.text,
                        tool_calls: update.tool_calls.as_ref(),
                        finish_reason: update.finish_reason,
                        ..ChunkUpdate::default()
                    };
                    sink.send(&header.chunk(index, update, tokenizer, request.logprobs));
                }
                completions[index] = Some(completion);
            }
            ChoiceEvent::Done { outcome: Err(error), .. } => {
                failure.get_or_insert(error);
            }
        }
        !sink.broken && !cut_off()
    });
    if let Err(error) = outcome {
        failure.get_or_insert(error);
    }
    match failure {
        Some(_) if cut_off() => sink.send(&ApiError::stopping().body()),
        Some(error) => sink.send(&ApiError::from_policy(error, request.endpoint.prompt_field()).body()),
        None if request.include_usage => {
            let completions: Vec<Completion> = completions.into_iter().flatten().collect();
            sink.send(&header.usage_chunk(&completions));
        }
        None => {}
    }
    sink.done();
}

/// One choice's streamed text so far.
struct ChoiceText<'a> {
    tokenizer: &'a Tokenizer,
    eos: &'a [u32],
    stops: StopMatcher,
    /// Bytes at the end of the text not sent yet because a stop string may start there.
    holdback: usize,
    /// The sampled tokens but an end-of-sequence one.
    tokens: Vec<u32>,
    decoded: TextStream,
    sent: usize,
    /// The request's tools when the reply is read for calls: nothing from `<tool_call>` on is
    /// sent as it comes; the calls go out whole once the choice is done.
    tools: Option<&'a ToolRequest>,
}

/// A streamed update sent when a choice is done: the rest of its content, its calls, its end.
struct LastUpdate {
    text: String,
    tool_calls: Option<Value>,
    finish_reason: Option<&'static str>,
}

impl<'a> ChoiceText<'a> {
    fn new(tokenizer: &'a Tokenizer, eos: &'a [u32], stops: &[String], tools: Option<&'a ToolRequest>) -> Self {
        let holdback = stops.iter().map(String::len).max().unwrap_or(0).saturating_sub(1);
        let stops = StopMatcher::new(stops);
        Self { tokenizer, eos, stops, holdback, tokens: Vec::new(), decoded: TextStream::default(), sent: 0, tools }
    }

    /// The end of the text up to which content may be sent: everything when no tools are read;
    /// nothing when the turn opened inside a call; else up to a call's start, holding back
    /// what may begin one.
    fn content_end(&self, text: &str) -> usize {
        match self.tools {
            None => text.len(),
            Some(tools) if tools.opens_in_call() => 0,
            Some(_) => text.find(CALL_START).unwrap_or(text.len().saturating_sub(CALL_START.len() - 1)),
        }
    }

    /// The updates that end the choice. With tools read and calls found: the rest of the
    /// content before the first call, the calls, and `tool_calls` as the finish reason;
    /// otherwise the rest of the text (the opening included) and the engine's finish reason.
    fn last_updates(&self, completion: &Completion) -> Vec<LastUpdate> {
        let finish =
            |reason: &'static str| LastUpdate { text: String::new(), tool_calls: None, finish_reason: Some(reason) };
        let read = match self.tools {
            Some(tools) => tools.read(&completion.text),
            None => Err(completion.text.clone()),
        };
        let reply = match read {
            Ok(reply) => reply,
            Err(content) => {
                let rest = content.get(self.sent..).unwrap_or_default().to_string();
                return vec![LastUpdate { text: rest, ..finish(completion.finish_reason.as_str()) }];
            }
        };
        let content = reply.content.unwrap_or_default();
        let calls: Vec<Value> = reply.calls.iter().enumerate().map(|(index, call)| call.json(Some(index))).collect();
        let mut updates = Vec::new();
        if let Some(rest) = content.get(self.sent..).filter(|rest| !rest.is_empty()) {
            updates.push(LastUpdate { text: rest.to_string(), tool_calls: None, finish_reason: None });
        }
        updates.push(LastUpdate { text: String::new(), tool_calls: Some(Value::Array(calls)), finish_reason: None });
        updates.push(finish(TOOL_CALLS_FINISH));
        updates
    }

    /// The text that `token` makes safe to send.
    fn push(&mut self, token: u32) -> String {
        if self.eos.contains(&token) {
            return String::new();
        }
        self.tokens.push(token);
        // A decoding failure leaves the text for the final completion to carry.
        let new_from = self.decoded.extend(self.tokenizer, &self.tokens).unwrap_or(self.sent);
        let text = self.decoded.text();
        let mut safe = match self.stops.find_since(text, new_from) {
            Some(found) => found.start,
            None => text.len().saturating_sub(self.holdback),
        };
        safe = safe.min(self.content_end(text));
        while !text.is_char_boundary(safe) {
            safe -= 1;
        }
        if safe <= self.sent {
            return String::new();
        }
        let piece = text[self.sent..safe].to_string();
        self.sent = safe;
        piece
    }
}

/// How long a streamed reply waits for its client to take the next event before it counts the
/// client as gone: one that stops reading would otherwise hold a worker thread and its
/// generations for ever.
pub const STREAM_STALL: Duration = Duration::from_secs(60);

/// Server-sent events into a streamed response body: each event is one frame, handed to the
/// HTTP layer as soon as it is written (a slow client makes this wait, up to a stall limit; a
/// client that went away or stalled makes it drop the rest).
pub struct EventSink {
    frames: tokio::sync::mpsc::Sender<Bytes>,
    stall: Duration,
    broken: bool,
}

impl EventSink {
    pub fn new(frames: tokio::sync::mpsc::Sender<Bytes>) -> Self {
        Self::with_stall(frames, STREAM_STALL)
    }

    /// A sink that gives up on a client that has taken no event for `stall`.
    fn with_stall(frames: tokio::sync::mpsc::Sender<Bytes>, stall: Duration) -> Self {
        Self { frames, stall, broken: false }
    }

    pub fn send(&mut self, event: &Value) {
        self.frame(format!("data: {event}\n\n"));
    }

    /// The `[DONE]` event, which ends the body.
    pub fn done(mut self) {
        self.frame("data: [DONE]\n\n".to_string());
    }

    fn frame(&mut self, text: String) {
        if !self.broken {
            self.broken = !self.hand_over(Bytes::from(text));
        }
    }

    /// Queues `frame` for the client, waiting while its queue is full; false once the client
    /// has gone or has taken nothing for the stall limit.
    fn hand_over(&self, mut frame: Bytes) -> bool {
        let deadline = Instant::now() + self.stall;
        loop {
            match self.frames.try_send(frame) {
                Ok(()) => return true,
                Err(TrySendError::Closed(_)) => return false,
                Err(TrySendError::Full(back)) if Instant::now() < deadline => {
                    frame = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(TrySendError::Full(_)) => return false,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use whale_text::MIN_VOCAB_SIZE;

    #[test]
    fn a_client_that_stops_reading_is_given_up_after_the_stall_limit() {
        let (frames, receiver) = tokio::sync::mpsc::channel(1);
        let (finished, waited) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sink = EventSink::with_stall(frames, Duration::from_millis(50));
            sink.send(&serde_json::json!({"n": 1}));
            let first_taken = !sink.broken;
            sink.send(&serde_json::json!({"n": 2}));
            let _ = finished.send((first_taken, sink.broken));
        });
        let outcome = waited.recv_timeout(Duration::from_secs(10)).expect("the sink gives up instead of blocking");
        assert_eq!(outcome, (true, true));
        drop(receiver);
    }

    #[test]
    fn streamed_pieces_hold_back_what_may_start_a_stop_string() {
        // Generation ends with the token that completes the stop string, as the engine does.
        let text = "the answer is 42. STOP";
        let tokenizer = Tokenizer::train_bpe([text, text], MIN_VOCAB_SIZE + 4).expect("bpe");
        let eos = [tokenizer.specials().im_end];
        let mut choice = ChoiceText::new(&tokenizer, &eos, &["STOP".to_string(), "!".to_string()], None);
        let mut sent = String::new();
        for id in tokenizer.encode(text).expect("ids") {
            sent.push_str(&choice.push(id));
            assert!(!sent.contains('S'), "{sent:?} reaches into the stop string");
        }
        assert_eq!(choice.push(eos[0]), "");
        let final_text = "the answer is 42. ";
        assert!(final_text.starts_with(&sent), "{sent:?}");
        let completion = completion_of(final_text);
        let last = choice.last_updates(&completion);
        assert_eq!(format!("{sent}{}", last[0].text), final_text);
    }

    fn completion_of(text: &str) -> Completion {
        Completion {
            text: text.to_string(),
            token_ids: Vec::new(),
            logprobs: Vec::new(),
            finish_reason: whale_policy::FinishReason::Stop,
            prompt_tokens: 0,
            completion_tokens: 0,
        }
    }

    /// With tools read, the content before a call streams as it comes, nothing from the call's
    /// start on does, and the calls go out whole at the end, then `tool_calls`; a reply whose
    /// block does not parse is sent as content after all.
    #[test]
    fn streamed_tool_calls_are_held_back_and_sent_whole() {
        let call = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>";
        let text = format!("Adding now. {call}");
        let tokenizer = Tokenizer::train_bpe([text.as_str(), text.as_str()], MIN_VOCAB_SIZE + 8).expect("bpe");
        let eos = [tokenizer.specials().im_end];
        let schema = serde_json::json!({"type": "function", "function": {"name": "add"}});
        let tools = ToolRequest::parse(Some(&[schema]), None, None).expect("tools").expect("some");
        let mut choice = ChoiceText::new(&tokenizer, &eos, &[], Some(&tools));
        let mut sent = String::new();
        for id in tokenizer.encode(&text).expect("ids") {
            sent.push_str(&choice.push(id));
            assert!(!sent.contains('<'), "{sent:?} reaches into the call");
        }
        let last = choice.last_updates(&completion_of(&text));
        assert_eq!(format!("{sent}{}", last[0].text), "Adding now. ");
        let calls = last.iter().find_map(|update| update.tool_calls.clone()).expect("the calls");
        assert_eq!(calls[0]["function"]["name"], "add");
        assert_eq!(calls[0]["index"], 0);
        assert_eq!(last.last().and_then(|update| update.finish_reason), Some(TOOL_CALLS_FINISH));
        let broken = choice.last_updates(&completion_of("Adding now. <tool_call>{oops"));
        assert_eq!(broken.len(), 1);
        assert_eq!(format!("{sent}{}", broken[0].text), "Adding now. <tool_call>{oops");
        assert_eq!(broken[0].finish_reason, Some("stop"));
    }

    #[test]
    fn events_are_data_lines_and_end_with_done() {
        let (frames, mut received) = tokio::sync::mpsc::channel(8);
        let mut sink = EventSink::new(frames);
        sink.send(&serde_json::json!({"a": 1}));
        sink.done();
        let mut body = Vec::new();
        while let Ok(frame) = received.try_recv() {
            body.extend_from_slice(&frame);
        }
        assert_eq!(String::from_utf8(body).expect("utf-8"), "data: {\"a\":1}\n\ndata: [DONE]\n\n");
    }
}
