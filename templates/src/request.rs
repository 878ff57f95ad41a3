//! The fields of an OpenAI chat-completions request that decide what the template renders.
//!
//! The HTTP API and `radix-serve template` both read requests through [`ChatRequest`], so a
//! request renders the same prompt whichever way it arrives. Unknown fields are ignored, as
//! OpenAI does.

use serde_json::{Map, Value as Json};

use crate::TemplateError;
use crate::render::RenderInput;

/// The template-relevant part of a chat-completions request.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    /// The conversation, each message an object with a string `role`.
    pub messages: Vec<Json>,
    /// Tool definitions, when the request has a `tools` array.
    pub tools: Option<Vec<Json>>,
    /// Extra template variables, e.g. `{"enable_thinking": false}`.
    pub chat_template_kwargs: Map<String, Json>,
    /// Open an assistant turn at the end (vLLM's extension; default true).
    pub add_generation_prompt: bool,
    /// Leave the last message open for the model to continue (vLLM's extension; default false).
    pub continue_final_message: bool,
}

impl ChatRequest {
    /// Reads a request body. Errors name the offending field, for an HTTP 400.
    pub fn from_json(body: &Json) -> Result<Self, TemplateError> {
        let bad = |m: String| TemplateError::BadRequest(m);
        let Json::Object(body) = body else {
            return Err(bad("the request body must be a JSON object".into()));
        };
        let messages = match body.get("messages") {
            Some(Json::Array(messages)) => messages.clone(),
            Some(_) => return Err(bad("'messages' must be an array of message objects".into())),
            None => return Err(bad("'messages' is a required property".into())),
        };
        for (i, message) in messages.iter().enumerate() {
            match message.get("role") {
                Some(Json::String(_)) => {}
                Some(_) => return Err(bad(format!("messages[{i}].role must be a string"))),
                None if message.is_object() => return Err(bad(format!("messages[{i}] has no 'role'"))),
                None => return Err(bad(format!("messages[{i}] must be an object"))),
            }
        }
        let tools = match body.get("tools") {
            None | Some(Json::Null) => None,
            Some(Json::Array(tools)) => Some(tools.clone()),
            Some(_) => return Err(bad("'tools' must be an array".into())),
        };
        let chat_template_kwargs = match body.get("chat_template_kwargs") {
            None | Some(Json::Null) => Map::new(),
            Some(Json::Object(kwargs)) => kwargs.clone(),
            Some(_) => return Err(bad("'chat_template_kwargs' must be an object".into())),
        };
        let flag = |name: &str, default: bool| match body.get(name) {
            None | Some(Json::Null) => Ok(default),
            Some(Json::Bool(b)) => Ok(*b),
            Some(_) => Err(bad(format!("'{name}' must be a boolean"))),
        };
        Ok(ChatRequest {
            messages,
            tools,
            chat_template_kwargs,
            add_generation_prompt: flag("add_generation_prompt", true)?,
            continue_final_message: flag("continue_final_message", false)?,
        })
    }

    /// The request as JSON again (what `radix-serve template --emit prepared-request` prints).
    pub fn to_json(&self) -> Json {
        let mut body = Map::new();
        body.insert("messages".into(), Json::Array(self.messages.clone()));
        if let Some(tools) = &self.tools {
            body.insert("tools".into(), Json::Array(tools.clone()));
        }
        body.insert("chat_template_kwargs".into(), Json::Object(self.chat_template_kwargs.clone()));
        body.insert("add_generation_prompt".into(), Json::Bool(self.add_generation_prompt));
        body.insert("continue_final_message".into(), Json::Bool(self.continue_final_message));
        Json::Object(body)
    }

    /// What the renderer takes.
    pub fn render_input(&self) -> RenderInput {
        RenderInput {
            messages: self.messages.clone(),
            tools: self.tools.clone(),
            add_generation_prompt: self.add_generation_prompt,
            continue_final_message: self.continue_final_message,
            kwargs: self.chat_template_kwargs.clone(),
        }
    }
}
