//! The runtime building blocks every layer kind is made of: linear maps (dense or quantized,
//! on whichever kernel is fastest for where they live), the token embedding and RMSNorm. They
//! hold loaded weights and compute; where the weights come from is [`crate::weights`]' business.

mod embedding;
mod linear;
mod norm;

pub(crate) use embedding::Embedding;
pub(crate) use linear::{Linear, Weight};
pub(crate) use norm::RmsNorm;
