#pragma once
/// memcalc: training-memory accounting for transformer language models, from the architecture alone.
#include "memcalc/activations.hpp"
#include "memcalc/architecture_activations.hpp"
#include "memcalc/error.hpp"
#include "memcalc/estimate.hpp"
#include "memcalc/flops.hpp"
#include "memcalc/model.hpp"
#include "memcalc/parallel.hpp"
#include "memcalc/params.hpp"
#include "memcalc/recipe.hpp"
#include "memcalc/timeline.hpp"
#include "memcalc/units.hpp"
#include "memcalc/version.hpp"
