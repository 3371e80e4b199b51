package api

import meterv1 "tokenmeter/proto/tokenmeter/v1"

// hideCost leaves the provider's cost out of a cost answer, for a caller
// that may not see it (seesCost): the allocated GPU cost, busy and idle,
// the costs per 1k tokens, and the requests and tokens left unattributed
// to a GPU deployment (a fact of the provider's fleet, which only explains
// the cost). What stays is the caller's own usage and what it is charged
// for it (requests, tokens, good output tokens, the list charge).
func hideCost(resp *meterv1.GetCostResponse) {
	for _, sr := range resp.GetSeries() {
		hidePointCost(sr.GetSummary())
		for _, p := range sr.GetPoints() {
			hidePointCost(p)
		}
	}
}

func hidePointCost(p *meterv1.CostPoint) {
	if p == nil {
		return
	}
	p.Cost, p.BusyCost, p.IdleCost = nil, nil, nil
	p.CostPer_1KOutputTokens, p.CostPer_1KTokens, p.CostPer_1KGoodOutputTokens = "", "", ""
	p.BusyCostPer_1KOutputTokens, p.BusyCostPer_1KTokens = "", ""
	p.UnattributedRequests, p.UnattributedInputTokens, p.UnattributedOutputTokens = 0, 0, 0
	p.CostPerRequest = ""
	p.GpuSeconds, p.GpuHours, p.BusyGpuHours, p.IdleGpuHours = "", 0, 0, 0
}
