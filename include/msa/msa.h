// msa: MiniMax-M3-style block-sparse attention. Umbrella header.
#pragma once

#include "msa/error.h"
#include "msa/ops.h"
#include "msa/plan.h"
#include "msa/tensor.h"
