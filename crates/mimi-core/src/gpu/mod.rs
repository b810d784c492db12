//! What the GPU paths add to candle's, each behind a switch that stays off until a device run
//! shows it faster and exact (docs/devices.md): CUDA graphs for streaming steps ([`graphs`]),
//! cuDNN convolutions ([`cudnn`]) and fused kernels compiled by NVRTC ([`kernels`]). Their
//! plans (which steps are captured, which convolution descriptors and workspaces a layer
//! needs, the kernels' sources) are device-independent and tested on the CPU; only the calls
//! into CUDA are behind the `cuda` feature.

pub mod cudnn;
pub mod graphs;
pub mod kernels;
