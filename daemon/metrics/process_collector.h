#pragma once
// Standard process_* metrics for this process, read from /proc/self at scrape time.

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <vector>

namespace offloadd::daemon {

class ProcessCollector : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override;
};

}  // namespace offloadd::daemon
