//! Model weights, tokenizers and architectures (filled by the model-runtime issue).
