//! Generation requests on a replica: the prompt (raw or a chat), stop strings, streaming events,
//! cancellation when the client goes away or the deadline passes.

use std::cell::RefCell;
use std::ops::ControlFlow;
use std::time::Instant;

use ipfs_accelerate::text::{ChatMessage, GenerateOptions};
use tokio::sync::mpsc::UnboundedSender;

use crate::engine::Engine;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::pool::{Envelope, Work};

/// What the model continues.
pub(crate) enum Prompt {
    /// Raw text.
    Text(String),
    /// A conversation, through the checkpoint's chat template.
    Chat(Vec<ChatMessage>),
}

/// How a generation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Finish {
    /// OpenAI's `finish_reason`: `stop` (end of sequence or a stop string) or `length`.
    pub(crate) reason: &'static str,
    /// Prompt tokens (after the chat template).
    pub(crate) prompt_tokens: usize,
    /// Generated tokens.
    pub(crate) completion_tokens: usize,
}

/// What a generation sends its client, in order: text pieces, then `Done` or `Error`.
#[derive(Debug)]
pub(crate) enum Event {
    Text(String),
    Done(Finish),
    Error(ApiError),
}

/// A generation request.
pub(crate) struct GenerateJob {
    pub(crate) prompt: Prompt,
    pub(crate) options: GenerateOptions,
    pub(crate) stop: Vec<String>,
    pub(crate) events: UnboundedSender<Event>,
    /// The server's request timeout, for the error message.
    pub(crate) timeout_s: f64,
    /// Text has been sent (see [`started`](Self::started)).
    started: bool,
}

impl GenerateJob {
    pub(crate) fn new(
        prompt: Prompt,
        options: GenerateOptions,
        stop: Vec<String>,
        events: UnboundedSender<Event>,
        timeout_s: f64,
    ) -> Self {
        GenerateJob {
            prompt,
            options,
            stop,
            events,
            timeout_s,
            started: false,
        }
    }

    /// Text has been sent: the request cannot be restarted elsewhere.
    pub(crate) fn started(&self) -> bool {
        self.started
    }

    pub(crate) fn abandoned(&self) -> bool {
        self.events.is_closed()
    }

    pub(crate) fn fail(self, e: ApiError) {
        let _ = self.events.send(Event::Error(e));
    }
}

/// A generation request of a running batch and how it stands.
pub(crate) struct Entry {
    /// The request (its work is [`Work::Generate`]).
    pub(crate) envelope: Envelope,
    matcher: StopMatcher,
    timed_out: bool,
    /// Its final event (`Done` or an error) was sent, or its client had already gone.
    pub(crate) answered: bool,
    /// A failure of this request alone on the server's side, left for the replica to handle
    /// (another replica may run it when it streamed nothing yet).
    pub(crate) failure: Option<ApiError>,
}

impl Entry {
    fn new(envelope: Envelope) -> Self {
        let matcher = match &envelope.work {
            Work::Generate(job) => StopMatcher::new(&job.stop),
            _ => StopMatcher::default(),
        };
        Entry {
            envelope,
            matcher,
            timed_out: false,
            answered: false,
            failure: None,
        }
    }

    fn job(&mut self) -> Option<&mut GenerateJob> {
        match &mut self.envelope.work {
            Work::Generate(job) => Some(job),
            _ => None,
        }
    }
}

/// Decodes `first` on `engine` as one batch and, between steps, the requests `more(free)`
/// hands over (continuous batching, up to `max_rows` at once, where the engine can change a
/// running batch), sending each request its events. Every request handed over is added to
/// `entries`, in order. `Err` is a failure of a whole step: the requests it left unanswered
/// (see [`Entry::answered`] and [`GenerateJob::started`]) are the caller's to answer, run alone
/// or hand on.
pub(crate) fn run(
    entries: &RefCell<Vec<Entry>>,
    first: Vec<Envelope>,
    engine: &Engine,
    metrics: &Metrics,
    model: &str,
    max_rows: usize,
    mut more: impl FnMut(usize) -> Vec<Envelope>,
) -> Result<(), ApiError> {
    let Engine::Generator(generator) = engine else {
        for envelope in first {
            entries.borrow_mut().push(Entry::new(envelope));
        }
        return Err(ApiError::internal(
            "generation on a replica that does not generate",
        ));
    };
    // The entry of each request handed to the generator, in the generator's numbering.
    let handed = RefCell::new(Vec::<usize>::new());
    // Adds `envelopes` to `entries` and returns the prompts of those the generator should run.
    let take = |envelopes: Vec<Envelope>| -> Vec<(String, GenerateOptions)> {
        let mut entries = entries.borrow_mut();
        let mut out = Vec::with_capacity(envelopes.len());
        for envelope in envelopes {
            let index = entries.len();
            let mut entry = Entry::new(envelope);
            if entry.envelope.work.abandoned() {
                // Its client is gone: nothing to run or to answer.
                entry.answered = true;
            } else if let Some(job) = entry.job() {
                let prompt = match &job.prompt {
                    Prompt::Text(t) => Ok(t.clone()),
                    Prompt::Chat(messages) => generator.apply_chat_messages(messages),
                };
                match prompt {
                    Ok(prompt) => {
                        out.push((prompt, job.options.clone()));
                        handed.borrow_mut().push(index);
                    }
                    Err(e) => {
                        let _ = job.events.send(Event::Error(ApiError::from(e)));
                        entry.answered = true;
                    }
                }
            } else {
                entry.failure = Some(ApiError::internal("a generation batch got other work"));
            }
            entries.push(entry);
        }
        out
    };
    let first = take(first);
    // A generator that cannot change a running batch never asks (`joins_running_batches`).
    let result = generator.generate_continuous(
        first,
        max_rows,
        |free| {
            let joining = more(free);
            metrics.observe_joins(model, joining.len());
            take(joining)
        },
        |request, piece| {
            let index = handed.borrow()[request];
            let mut entries = entries.borrow_mut();
            let entry = &mut entries[index];
            let deadline = entry.envelope.deadline;
            let Some(job) = entry.job() else {
                return ControlFlow::Break(());
            };
            if job.events.is_closed() {
                return ControlFlow::Break(());
            }
            if Instant::now() >= deadline {
                entry.timed_out = true;
                return ControlFlow::Break(());
            }
            let emit = entry.matcher.push(piece);
            let hit = entry.matcher.hit;
            if let Some(job) = entry.job() {
                if !emit.is_empty() {
                    job.started = true;
                    let _ = job.events.send(Event::Text(emit));
                }
            }
            if hit {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        },
        |request, output| {
            let index = handed.borrow()[request];
            let mut entries = entries.borrow_mut();
            let entry = &mut entries[index];
            let timed_out = entry.timed_out;
            let rest = if entry.matcher.hit {
                String::new()
            } else {
                entry.matcher.flush()
            };
            let hit = entry.matcher.hit;
            let Some(job) = entry.job() else {
                return;
            };
            let event = match output {
                Err(e) => {
                    let e = ApiError::from(e);
                    if !e.is_client_error() {
                        entry.failure = Some(e);
                        return;
                    }
                    Event::Error(e)
                }
                Ok(_) if timed_out => Event::Error(ApiError::timeout(job.timeout_s)),
                Ok(output) => {
                    if !rest.is_empty() {
                        let _ = job.events.send(Event::Text(rest));
                    }
                    let generated = &output.value;
                    let reason = if !hit && generated.token_ids.len() >= job.options.max_new_tokens
                    {
                        "length"
                    } else {
                        "stop"
                    };
                    metrics.observe_generation(
                        model,
                        generated.token_ids.len(),
                        generated.decode_tokens_per_s,
                    );
                    Event::Done(Finish {
                        reason,
                        prompt_tokens: generated.prompt_ids.len(),
                        completion_tokens: generated.token_ids.len(),
                    })
                }
            };
            let _ = job.events.send(event);
            entry.answered = true;
        },
    );
    result.map_err(ApiError::from)
}

/// Cuts generated text at the first stop string, holding back any tail that may be the start of
/// one until the next piece decides it (OpenAI's `stop`: the stop string itself is not returned).
#[derive(Debug, Default)]
pub(crate) struct StopMatcher {
    stops: Vec<String>,
    held: String,
    /// A stop string was found; nothing more is to be emitted.
    pub(crate) hit: bool,
}

impl StopMatcher {
    pub(crate) fn new(stops: &[String]) -> Self {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
            hit: false,
        }
    }

    /// Adds generated text; returns what can be sent now.
    pub(crate) fn push(&mut self, piece: &str) -> String {
        if self.hit {
            return String::new();
        }
        self.held.push_str(piece);
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            self.hit = true;
            let out = self.held[..at].to_string();
            self.held.clear();
            return out;
        }
        // The longest tail of `held` that begins some stop string stays held.
        let keep = self
            .stops
            .iter()
            .map(|s| {
                (1..s.len().min(self.held.len() + 1))
                    .rev()
                    .find(|&n| {
                        let start = self.held.len() - n;
                        self.held.is_char_boundary(start)
                            && s.is_char_boundary(n)
                            && s.starts_with(&self.held[start..])
                    })
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        out
    }

    /// What is still held, at the end of the generation.
    pub(crate) fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::StopMatcher;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut out = String::new();
        for p in pieces {
            out += &m.push(p);
        }
        if !m.hit {
            out += &m.flush();
        }
        (out, m.hit)
    }

    #[test]
    fn stop_strings_split_across_pieces_are_cut() {
        assert_eq!(
            run(&["\n\n"], &["Hello", "\n", "\nworld"]),
            ("Hello".into(), true)
        );
        assert_eq!(
            run(&["END"], &["abc E", "N", "D tail"]),
            ("abc ".into(), true)
        );
        assert_eq!(run(&["xyz"], &["ab", "x", "y"]), ("abxy".into(), false));
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
        assert_eq!(run(&["é!"], &["café", "!"]), ("caf".into(), true));
        assert_eq!(run(&["b", "abc"], &["xab"]), ("xa".into(), true));
    }

    #[test]
    fn held_text_is_released_once_it_cannot_start_a_stop_string() {
        let stops = vec!["STOP".to_string()];
        let mut m = StopMatcher::new(&stops);
        assert_eq!(m.push("go ST"), "go ");
        assert_eq!(m.push("ART"), "START");
        assert!(!m.hit);
    }
}
