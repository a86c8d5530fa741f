// The robust rule (aggregation/robust.h) a run's aggregation section names, for the config's
// validation (the rule's bound on selection.min_clients) and the server's factory alike.
#pragma once

#include <optional>

#include "aggregation/robust.h"
#include "fedlora/v1/config.pb.h"

namespace fedlora {

// MEDIAN, TRIMMED_MEAN, KRUM, MULTI_KRUM and BULYAN with trim_fraction, krum_byzantine_clients and
// multi_krum_keep as set; nullopt for any other strategy.
std::optional<RobustOptions> RobustOptionsOf(const v1::AggregationConfig& a);

}  // namespace fedlora
