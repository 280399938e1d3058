"""Cloud cost estimator (name "cloud"): Sailor's C_comp + C_comm (seed 000, sec. 4.3).

C_comp = sum over used GPUs of price_per_gpu_hour_usd / 3600 x iteration time;
C_comm = bytes leaving a zone x the egress price per GB of that zone pair (GB = 1e9 bytes);
traffic inside a zone is free. Prices come from the instance (`cluster.network.egress`).
"""
from __future__ import annotations

from hetplan.estimators.base import Endpoint
from hetplan.instance import Egress, Instance


class CloudCost:
    name = "cloud"
    OPTIONS: tuple[str, ...] = ()  # the estimators.options keys it reads

    def __init__(self, egress: Egress):
        self.egress = egress
        self._pairs = {frozenset(p.zones): p.usd_per_GB for p in egress.pairs}

    @classmethod
    def from_instance(cls, instance: Instance, options: dict) -> "CloudCost":
        return cls(instance.cluster.network.egress)

    def compute_usd(self, price_per_gpu_hour_usd: float, num_gpus: int, time_s: float) -> float:
        return price_per_gpu_hour_usd * num_gpus * time_s / 3600.0

    def egress_price_usd_per_GB(self, a: Endpoint, b: Endpoint) -> float:
        if a.zone == b.zone:
            return 0.0
        pair = self._pairs.get(frozenset((a.zone, b.zone)))
        if pair is not None:
            return pair
        return self.egress.inter_zone_usd_per_GB if a.region == b.region else self.egress.inter_region_usd_per_GB

    def egress_usd(self, a: Endpoint, b: Endpoint, nbytes: float) -> float:
        return self.egress_price_usd_per_GB(a, b) * nbytes / 1e9
