package api

import (
	"testing"

	"tokenmeter/billing"
	"tokenmeter/billing/closing"
)

// TestStatementFinanceContractFigures: the finance message carries the
// contract's revenue that is on no line (dedicated GPU-hours, commitment
// true-up) beside the usage charge and the margin that counts them, and
// leaves them unset without.
func TestStatementFinanceContractFigures(t *testing.T) {
	st := billing.Statement{Tenant: "acme", Currency: "USD", Finance: &billing.StatementFinance{
		UsageCharge: 9_850_000_000, DedicatedCharge: 7_000_000_000, CommitmentCharge: 83_150_000_000,
		AllocatedCost: 9_000_000_000, Margin: 91_000_000_000}}
	f := statementProto(closing.StatementView{Statement: st}).GetFinance()
	if f.GetDedicatedCharge().GetNanos() != 7_000_000_000 || f.GetCommitmentCharge().GetNanos() != 83_150_000_000 ||
		f.GetMargin().GetNanos() != 91_000_000_000 || f.GetUsageCharge().GetNanos() != 9_850_000_000 {
		t.Errorf("finance %v", f)
	}
	st.Finance.DedicatedCharge, st.Finance.CommitmentCharge = 0, 0
	if f := statementProto(closing.StatementView{Statement: st}).GetFinance(); f.DedicatedCharge != nil || f.CommitmentCharge != nil {
		t.Errorf("without a contract: finance %v", f)
	}
}
