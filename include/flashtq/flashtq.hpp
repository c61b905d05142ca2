// flashtq: exact FlashAttention and attention over a TurboQuant-compressed KV cache.
#pragma once

#include "flashtq/attention.hpp"
#include "flashtq/backend.hpp"
#include "flashtq/error.hpp"
#include "flashtq/problem.hpp"
#include "flashtq/tensor.hpp"
#include "flashtq/tq_paged_cache.hpp"
#include "flashtq/turboquant.hpp"
#include "flashtq/version.hpp"
