package api

import (
	"testing"
	"time"

	"tokenmeter/billing"
	"tokenmeter/billing/closing"
)

// TestStatementProtoCharges: a statement's charges and its lines'
// contracted charge and discount reach the API; a line without a contract
// has neither.
func TestStatementProtoCharges(t *testing.T) {
	at := time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC)
	cc, d := billing.Money(8_500_000_000), billing.Money(-4_000_000_000)
	st := billing.Statement{Tenant: "acme", Period: "2026-11", Currency: "USD",
		Lines: []billing.StatementLine{{Kind: billing.LineUsage, Model: "m", Charge: 12_500_000_000, ContractedCharge: &cc, Discount: &d}, {Kind: billing.LineUsage, Model: "n"}},
		Charges: []billing.Charge{{Kind: billing.ChargeDiscount, Line: 0, Model: "m", TokenKind: billing.TokenOutput, Quantity: "500000", Unit: "tokens",
			UnitPrice: "0", Rule: "allowance:m/output", ChargeStart: at, ChargeEnd: at.Add(time.Hour), Amount: d},
			{Kind: billing.ChargeCommitment, Line: -1, Amount: 1}}}
	out := statementProto(closing.StatementView{Statement: st})
	l := out.GetLines()[0]
	if l.GetContractedCharge().GetNanos() != 8_500_000_000 || l.GetDiscount().GetNanos() != -4_000_000_000 || out.GetLines()[1].GetContractedCharge() != nil {
		t.Errorf("lines %v", out.GetLines())
	}
	c := out.GetCharges()
	if len(c) != 2 || c[0].GetKind() != "discount" || c[0].GetLine() != 0 || c[0].GetTokenKind() != "output" || c[0].GetQuantity() != "500000" ||
		c[0].GetUnitPrice() != "0" || c[0].GetRule() != "allowance:m/output" || c[0].GetAmount().GetNanos() != -4_000_000_000 ||
		!c[0].GetChargeStart().AsTime().Equal(at) || c[1].GetLine() != -1 || c[1].GetKind() != "commitment" {
		t.Errorf("charges %v", c)
	}
}
