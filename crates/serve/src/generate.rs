//! Generation requests on a replica: the prompt (raw or a chat), stop strings, streaming events,
//! cancellation when the client goes away or the deadline passes.

use std::ops::ControlFlow;
use std::time::Instant;

use ipfs_accelerate::text::{ChatMessage, GenerateOptions};
use tokio::sync::mpsc::UnboundedSender;

use crate::engine::Engine;
use crate::error::ApiError;
use crate::metrics::Metrics;

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

/// Runs `jobs` (each with its deadline) on `engine` as one batch, sending each its events. `Err`
/// is a failure of the whole batch, unanswered (the caller answers it, runs the jobs alone or
/// hands them on; [`GenerateJob::started`] says which already streamed text).
pub(crate) fn run(
    jobs: &mut [(&mut GenerateJob, Instant)],
    engine: &Engine,
    metrics: &Metrics,
    model: &str,
) -> Result<(), ApiError> {
    let Engine::Generator(generator) = engine else {
        return Err(ApiError::internal(
            "generation on a replica that does not generate",
        ));
    };
    let mut prompts = Vec::with_capacity(jobs.len());
    for (job, _) in jobs.iter() {
        prompts.push(match &job.prompt {
            Prompt::Text(t) => t.clone(),
            Prompt::Chat(messages) => generator.apply_chat_messages(messages)?,
        });
    }
    let mut matchers: Vec<StopMatcher> = jobs
        .iter()
        .map(|(j, _)| StopMatcher::new(&j.stop))
        .collect();
    let mut timed_out = vec![false; jobs.len()];
    let mut started = vec![false; jobs.len()];
    let senders: Vec<_> = jobs.iter().map(|(j, _)| j.events.clone()).collect();
    let deadlines: Vec<Instant> = jobs.iter().map(|(_, d)| *d).collect();
    let requests: Vec<(&str, &GenerateOptions)> = prompts
        .iter()
        .zip(jobs.iter())
        .map(|(p, (j, _))| (p.as_str(), &j.options))
        .collect();
    let out = generator.generate_many(&requests, |row, piece| {
        if senders[row].is_closed() {
            return ControlFlow::Break(());
        }
        if Instant::now() >= deadlines[row] {
            timed_out[row] = true;
            return ControlFlow::Break(());
        }
        let emit = matchers[row].push(piece);
        if !emit.is_empty() {
            started[row] = true;
            let _ = senders[row].send(Event::Text(emit));
        }
        if matchers[row].hit {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    for ((job, _), s) in jobs.iter_mut().zip(&started) {
        job.started |= *s;
    }
    let outputs = out?;
    for (row, ((job, _), output)) in jobs.iter_mut().zip(outputs).enumerate() {
        let matcher = &mut matchers[row];
        if timed_out[row] {
            let _ = job
                .events
                .send(Event::Error(ApiError::timeout(job.timeout_s)));
            continue;
        }
        if !matcher.hit {
            let rest = matcher.flush();
            if !rest.is_empty() {
                let _ = job.events.send(Event::Text(rest));
            }
        }
        let generated = &output.value;
        let reason = if !matcher.hit && generated.token_ids.len() >= job.options.max_new_tokens {
            "length"
        } else {
            "stop"
        };
        metrics.observe_generation(
            model,
            generated.token_ids.len(),
            generated.decode_tokens_per_s,
        );
        let _ = job.events.send(Event::Done(Finish {
            reason,
            prompt_tokens: generated.prompt_ids.len(),
            completion_tokens: generated.token_ids.len(),
        }));
    }
    Ok(())
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
