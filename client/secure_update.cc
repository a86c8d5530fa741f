#include "client/secure_update.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "aggregation/fedavg.h"
#include "core/status.h"
#include "crypto/prg.h"
#include "crypto/random.h"
#include "crypto/secagg_fixed_point.h"
#include "privacy/gaussian_noise.h"

namespace fedlora {

absl::StatusOr<std::vector<uint64_t>> EncodeSecureUpdate(const std::vector<NamedTensor>& delta,
                                                         const v1::SecureAggregationTask& task) {
  std::vector<UpdateTensor> update = delta;  // clipped in place below
  std::sort(update.begin(), update.end(),
            [](const UpdateTensor& a, const UpdateTensor& b) { return a.name < b.name; });
  uint64_t count = 0;
  for (const UpdateTensor& t : update) count += t.values.size();
  if (count != task.params().vector_length()) {
    return absl::InvalidArgumentError(absl::StrCat("the update has ", count,
                                                   " values, the secure aggregation expects ",
                                                   task.params().vector_length()));
  }
  for (const UpdateTensor& t : update) {
    for (float v : t.values) {
      if (!std::isfinite(v))
        return absl::InvalidArgumentError(
            absl::StrCat("tensor ", t.name, " has a non-finite value"));
    }
  }
  ClipUpdateNorm(update, task.clip_norm());
  std::vector<float> flat;
  flat.reserve(count);
  for (const UpdateTensor& t : update) flat.insert(flat.end(), t.values.begin(), t.values.end());
  std::vector<UpdateTensor>().swap(update);
  if (task.noise_stddev() > 0) {
    FEDLORA_ASSIGN_OR_RETURN(std::string key, crypto::RandomBytes(crypto::Prg::kSeedBytes));
    FEDLORA_ASSIGN_OR_RETURN(privacy::GaussianSampler noise,
                             privacy::GaussianSampler::Create(key, 0));
    for (float& v : flat) {
      FEDLORA_ASSIGN_OR_RETURN(double z, noise.Next());
      v = static_cast<float>(static_cast<double>(v) + task.noise_stddev() * z);
    }
  }
  float range = static_cast<float>(task.range());
  if (static_cast<double>(range) > task.range())
    range = std::nextafter(range, 0.0f);  // stay within it
  for (float& v : flat) v = std::clamp(v, -range, range);
  FEDLORA_ASSIGN_OR_RETURN(std::string seed, crypto::RandomBytes(crypto::Prg::kSeedBytes));
  FEDLORA_ASSIGN_OR_RETURN(crypto::Prg prg, crypto::Prg::Create(seed));
  return crypto::EncodeSecAggFixedPoint(flat, task.range(), task.frac_bits(),
                                        task.params().modulus_bits(), prg);
}

}  // namespace fedlora
