package focuscheck

import (
	"slices"
	"strings"
	"testing"
)

// goodCSV is a small FOCUS 1.2 file that meets every rule: two usage rows
// of October, late usage of September (a Correction), a credit and a
// rounding adjustment that bring BilledCost to the invoice's 1.24.
const goodCSV = `BilledCost,BillingAccountId,BillingAccountName,BillingCurrency,BillingPeriodEnd,BillingPeriodStart,ChargeCategory,ChargeClass,ChargeDescription,ChargeFrequency,ChargePeriodEnd,ChargePeriodStart,ConsumedQuantity,ConsumedUnit,ContractedCost,ContractedUnitPrice,EffectiveCost,InvoiceId,InvoiceIssuerName,ListCost,ListUnitPrice,PricingCategory,PricingQuantity,PricingUnit,ProviderName,PublisherName,RegionId,RegionName,ResourceId,ResourceName,ResourceType,ServiceCategory,ServiceName,ServiceSubcategory,SkuId,SkuMeter,SkuPriceDetails,SkuPriceId,SubAccountId,SubAccountName,Tags,x_Model
0.612345,acme,Acme Corp,USD,2026-11-01T00:00:00Z,2026-10-01T00:00:00Z,Usage,,m input tokens,Usage-Based,2026-10-20T11:00:00Z,2026-10-20T10:00:00Z,500000,Tokens,0.612345,1.22469,0.612345,INV-1,Op Inc,0.612345,1.22469,Standard,0.5,1000000 Tokens,Op Inc,Op Inc,eu-west,Europe West,d1,Deployment 1,Model Deployment,AI and Machine Learning,Inference,Generative AI,m-input,Input Tokens,"{""x_TokenKind"":""input""}",m-input-p1,acme-prod,Acme Production,,m
1,acme,Acme Corp,USD,2026-11-01T00:00:00Z,2026-10-01T00:00:00Z,Usage,,m output tokens,Usage-Based,2026-10-20T11:00:00Z,2026-10-20T10:00:00Z,250000,Tokens,1,4,1,INV-1,Op Inc,1,4,Standard,0.25,1000000 Tokens,Op Inc,Op Inc,eu-west,Europe West,d1,Deployment 1,Model Deployment,AI and Machine Learning,Inference,Generative AI,m-output,Output Tokens,"{""x_TokenKind"":""output""}",m-output-p1,acme-prod,Acme Production,,m
0.122469,acme,Acme Corp,USD,2026-11-01T00:00:00Z,2026-10-01T00:00:00Z,Usage,Correction,late m input tokens of 2026-09,Usage-Based,2026-09-30T11:00:00Z,2026-09-30T10:00:00Z,100000,Tokens,0.122469,1.22469,0.122469,INV-1,Op Inc,0.122469,1.22469,Standard,0.1,1000000 Tokens,Op Inc,Op Inc,eu-west,Europe West,d1,Deployment 1,Model Deployment,AI and Machine Learning,Inference,Generative AI,m-input,Input Tokens,"{""x_TokenKind"":""input""}",m-input-p1,acme-prod,Acme Production,,m
-0.5,acme,Acme Corp,USD,2026-11-01T00:00:00Z,2026-10-01T00:00:00Z,Credit,,promotional credit,One-Time,2026-11-01T00:00:00Z,2026-10-01T00:00:00Z,,,-0.5,,-0.5,INV-1,Op Inc,-0.5,,,,,Op Inc,Op Inc,,,,,,AI and Machine Learning,Inference,Generative AI,,,,,acme-prod,Acme Production,,
0.005186,acme,Acme Corp,USD,2026-11-01T00:00:00Z,2026-10-01T00:00:00Z,Adjustment,,rounding to the cent,One-Time,2026-11-01T00:00:00Z,2026-10-01T00:00:00Z,,,0.005186,,0.005186,INV-1,Op Inc,0.005186,,,,,Op Inc,Op Inc,,,,,,AI and Machine Learning,Inference,Generative AI,,,,,acme-prod,Acme Production,,
`

// fullProfile is a provider like this project: every condition holds.
var fullProfile = Profile{AccountNaming: true, Regions: true, SubAccounts: true, UnitPricing: true, UsageMeasurement: true,
	NegotiatedPricing: true, Resources: true, Invoices: true,
	Payable: map[string]string{PayableKey("acme", "2026-10-01T00:00:00Z"): "1.24"}}

func good(t *testing.T) *Dataset {
	t.Helper()
	d, err := ReadCSV("good.csv", strings.NewReader(goodCSV))
	if err != nil {
		t.Fatal(err)
	}
	d.Metadata = map[string]string{"FocusVersion": "1.2", "DataGenerator": "test"}
	return d
}

// set sets row r's col (adding the column, all null, when missing); "<null>"
// is null.
func (d *Dataset) set(r int, col, v string) {
	if !d.Has(col) {
		d.addColumn(col, len(d.Columns))
	}
	d.Rows[r][d.index[col]] = Cell{Text: v, Null: v == "<null>"}
	if v == "<null>" {
		d.Rows[r][d.index[col]].Text = ""
	}
}

func (d *Dataset) addColumn(col string, at int) {
	d.Columns = slices.Insert(d.Columns, at, col)
	d.Kinds = slices.Insert(d.Kinds, at, KindText)
	for i := range d.Rows {
		d.Rows[i] = slices.Insert(d.Rows[i], at, Cell{Null: true})
	}
	_ = d.indexColumns()
}

func (d *Dataset) drop(col string) {
	i := d.index[col]
	d.Columns = slices.Delete(d.Columns, i, i+1)
	d.Kinds = slices.Delete(d.Kinds, i, i+1)
	for r := range d.Rows {
		d.Rows[r] = slices.Delete(d.Rows[r], i, i+1)
	}
	_ = d.indexColumns()
}

// bad breaks the good file so that the rule named fails.
var bad = map[string]func(d *Dataset){
	"ColumnHandling/CustomColumnsPrefixed":     func(d *Dataset) { d.Columns[len(d.Columns)-1] = "Model"; _ = d.indexColumns() },
	"ColumnHandling/FocusColumnsFirst":         func(d *Dataset) { d.addColumn("x_First", 0) },
	"NullHandling/NoPlaceholders":              func(d *Dataset) { d.set(0, "ResourceName", "N/A") },
	"StringHandling/NotBlank":                  func(d *Dataset) { d.set(0, "ProviderName", "  ") },
	"Metadata/FocusVersion":                    func(d *Dataset) { d.Metadata["FocusVersion"] = "1.1" },
	"BilledCost/InvoiceTotal":                  func(d *Dataset) { d.set(0, "BilledCost", "0.612346") },
	"BillingAccountId/OneName":                 func(d *Dataset) { d.set(1, "BillingAccountName", "acme") },
	"BillingAccountName/NotNull":               func(d *Dataset) { d.set(0, "BillingAccountName", "<null>") },
	"BillingCurrency/NationalCurrency":         func(d *Dataset) { d.set(0, "BillingCurrency", "usd") },
	"BillingCurrency/OnePerInvoice":            func(d *Dataset) { d.set(1, "BillingCurrency", "EUR") },
	"BillingPeriod/StartBeforeEnd":             func(d *Dataset) { d.set(0, "BillingPeriodEnd", "2026-09-01T00:00:00Z") },
	"ChargeCategory/AllowedValues":             func(d *Dataset) { d.set(0, "ChargeCategory", "Discount") },
	"ChargeClass/AllowedValues":                func(d *Dataset) { d.set(0, "ChargeClass", "Refund") },
	"ChargeClass/CorrectionOfEarlierPeriod":    func(d *Dataset) { d.set(2, "ChargeClass", "<null>") },
	"ChargeDescription/NotNull":                func(d *Dataset) { d.set(0, "ChargeDescription", "<null>") },
	"ChargeFrequency/AllowedValues":            func(d *Dataset) { d.set(0, "ChargeFrequency", "Hourly") },
	"ChargeFrequency/NotUsageBasedForPurchase": func(d *Dataset) { d.set(0, "ChargeCategory", "Purchase") },
	"ChargePeriod/StartBeforeEnd":              func(d *Dataset) { d.set(0, "ChargePeriodEnd", "2026-10-20T10:00:00Z") },
	"ChargePeriod/WithinBillingPeriod":         func(d *Dataset) { d.set(0, "ChargePeriodEnd", "2026-11-01T01:00:00Z") },
	"CommitmentDiscountCategory/AllowedValues": func(d *Dataset) { d.set(0, "CommitmentDiscountCategory", "Reserved") },
	"CommitmentDiscountStatus/AllowedValues":   func(d *Dataset) { d.set(0, "CommitmentDiscountStatus", "Partial") },
	"CapacityReservationStatus/AllowedValues":  func(d *Dataset) { d.set(0, "CapacityReservationStatus", "Partial") },
	"ConsumedQuantity/NullUnlessUsage": func(d *Dataset) {
		d.set(3, "ConsumedQuantity", "1")
		d.set(3, "ConsumedUnit", "Tokens")
	},
	"ConsumedQuantity/NotNullForUsage":                           func(d *Dataset) { d.set(0, "ConsumedQuantity", "<null>") },
	"ConsumedUnit/NullWithConsumedQuantity":                      func(d *Dataset) { d.set(0, "ConsumedUnit", "<null>") },
	"ConsumedUnit/UnitFormat":                                    func(d *Dataset) { d.set(0, "ConsumedUnit", "tokens") },
	"ContractedCost/UnitPriceTimesQuantity":                      func(d *Dataset) { d.set(0, "ContractedCost", "0.61234") },
	"ContractedCost/MatchesBilledCostOfCredits":                  func(d *Dataset) { d.set(3, "ContractedCost", "-0.4") },
	"ContractedUnitPrice/Nullability":                            func(d *Dataset) { d.set(0, "ContractedUnitPrice", "<null>") },
	"ContractedUnitPrice/NonNegative":                            func(d *Dataset) { d.set(3, "ContractedUnitPrice", "-1") },
	"EffectiveCost/MatchesBilledCostOfCredits":                   func(d *Dataset) { d.set(3, "EffectiveCost", "-0.4") },
	"InvoiceId/NotNullWhenInvoiced":                              func(d *Dataset) { d.set(0, "InvoiceId", "<null>") },
	"InvoiceId/OneBillingAccount":                                func(d *Dataset) { d.set(1, "BillingAccountId", "globex") },
	"ListCost/UnitPriceTimesQuantity":                            func(d *Dataset) { d.set(0, "ListCost", "0.61234") },
	"ListCost/MatchesBilledCostOfCredits":                        func(d *Dataset) { d.set(3, "ListCost", "-0.4") },
	"ListUnitPrice/Nullability":                                  func(d *Dataset) { d.set(0, "ListUnitPrice", "<null>") },
	"ListUnitPrice/NonNegative":                                  func(d *Dataset) { d.set(3, "ListUnitPrice", "-1") },
	"PricingCategory/AllowedValues":                              func(d *Dataset) { d.set(0, "PricingCategory", "Spot") },
	"PricingCategory/Nullability":                                func(d *Dataset) { d.set(0, "PricingCategory", "<null>") },
	"PricingQuantity/Nullability":                                func(d *Dataset) { d.set(0, "PricingQuantity", "<null>") },
	"PricingUnit/NullWithPricingQuantity":                        func(d *Dataset) { d.set(0, "PricingUnit", "<null>") },
	"PricingUnit/UnitFormat":                                     func(d *Dataset) { d.set(0, "PricingUnit", "1M Tokens") },
	"RegionId/NotNullForRegionalUsage":                           func(d *Dataset) { d.set(0, "RegionId", "<null>"); d.set(0, "RegionName", "<null>") },
	"RegionName/NullWithRegionId":                                func(d *Dataset) { d.set(0, "RegionName", "<null>") },
	"RegionId/OneName":                                           func(d *Dataset) { d.set(1, "RegionName", "Elsewhere") },
	"ResourceName/NullWithoutResourceId":                         func(d *Dataset) { d.set(3, "ResourceName", "Deployment 1") },
	"ResourceType/NullWithResourceId":                            func(d *Dataset) { d.set(0, "ResourceType", "<null>") },
	"ServiceCategory/AllowedValues":                              func(d *Dataset) { d.set(0, "ServiceCategory", "AI") },
	"ServiceName/OneServiceCategory":                             func(d *Dataset) { d.set(1, "ServiceCategory", "Compute") },
	"ServiceSubcategory/AllowedValuesAndParent":                  func(d *Dataset) { d.set(0, "ServiceSubcategory", "Virtual Machines") },
	"SkuId/Nullability":                                          func(d *Dataset) { d.set(0, "SkuId", "<null>") },
	"SkuMeter/NullWithoutSkuId":                                  func(d *Dataset) { d.set(0, "SkuMeter", "<null>") },
	"SkuMeter/ConsistentPerSkuId":                                func(d *Dataset) { d.set(2, "SkuMeter", "Cached Input Tokens") },
	"SkuPriceDetails/NullWithoutSkuPriceId":                      func(d *Dataset) { d.set(3, "SkuPriceDetails", "{}") },
	"SkuPriceDetails/PropertyKeys":                               func(d *Dataset) { d.set(0, "SkuPriceDetails", `{"TokenKind":"input"}`) },
	"SkuPriceDetails/OnePerSkuPriceId":                           func(d *Dataset) { d.set(2, "SkuPriceDetails", `{"x_TokenKind":"cached"}`) },
	"SkuPriceId/Nullability":                                     func(d *Dataset) { d.set(0, "SkuPriceId", "<null>") },
	"SkuPriceId/OneParentSkuId":                                  func(d *Dataset) { d.set(2, "SkuId", "m-cached") },
	"SkuPriceId/OneListUnitPrice":                                func(d *Dataset) { d.set(1, "SkuPriceId", "m-input-p1") },
	"SubAccountName/NullWithSubAccountId":                        func(d *Dataset) { d.set(0, "SubAccountName", "<null>") },
	"BillingAccountType/NullWithBillingAccountId":                func(d *Dataset) { d.set(0, "BillingAccountType", "Enterprise") },
	"SubAccountType/NullWithSubAccountId":                        func(d *Dataset) { d.set(0, "SubAccountType", "Team") },
	"CommitmentDiscountCategory/NullWithCommitmentDiscountId":    func(d *Dataset) { d.set(0, "CommitmentDiscountCategory", "Spend") },
	"CommitmentDiscountType/NullWithCommitmentDiscountId":        func(d *Dataset) { d.set(0, "CommitmentDiscountType", "Reservation") },
	"CommitmentDiscountName/NullWithoutCommitmentDiscountId":     func(d *Dataset) { d.set(0, "CommitmentDiscountName", "plan") },
	"CommitmentDiscountStatus/NullWithoutCommitmentDiscountId":   func(d *Dataset) { d.set(0, "CommitmentDiscountStatus", "Used") },
	"CapacityReservationStatus/NullWithoutCapacityReservationId": func(d *Dataset) { d.set(0, "CapacityReservationStatus", "Used") },
}

// badGeneric breaks the good file for the rules made for every column.
func badGeneric(name string) func(d *Dataset) {
	col, req, _ := strings.Cut(name, "/")
	switch req {
	case "Present":
		return func(d *Dataset) {
			if d.Has(col) {
				d.drop(col)
			}
		}
	case "NotNull":
		return func(d *Dataset) { d.set(0, col, "<null>") }
	case "TypeDecimal":
		return func(d *Dataset) { d.set(0, col, "1,5") }
	case "TypeDateTime":
		return func(d *Dataset) { d.set(0, col, "2026-10-01 00:00:00") }
	case "TypeString":
		return func(d *Dataset) {
			d.set(0, col, "1")
			d.Kinds[d.index[col]] = KindInteger
		}
	case "KeyValueFormat":
		return func(d *Dataset) { d.set(0, col, `{"a":1,"a":2}`) }
	}
	return nil
}

// TestGoodFilePasses runs every rule on the good file: none fails.
func TestGoodFilePasses(t *testing.T) {
	Run(t, good(t), fullProfile)
}

// TestEachRuleFails breaks the good file once per rule: the rule must fail,
// so that each rule is shown to be able to fail.
func TestEachRuleFails(t *testing.T) {
	for _, ru := range Rules() {
		t.Run(ru.Name, func(t *testing.T) {
			breakIt := bad[ru.Name]
			if breakIt == nil {
				breakIt = badGeneric(ru.Name)
			}
			if breakIt == nil {
				t.Fatalf("no bad file for rule %s", ru.Name)
			}
			d := good(t)
			breakIt(d)
			if v := ru.Check(d, fullProfile); len(v) == 0 {
				t.Errorf("rule %s passed a file broken for it", ru.Name)
			}
		})
	}
}

// TestKeyValueFormat checks the JSON object rule on values the
// specification names.
func TestKeyValueFormat(t *testing.T) {
	for s, ok := range map[string]bool{
		`{"StorageClass":"Archive","CoreCount":4,"x_PremiumProcessing":true}`: true,
		`{}`:            true,
		`{"a":null}`:    true,
		`{"a":{"b":1}}`: false,
		`{"a":[1]}`:     false,
		`{"a":1,"a":1}`: false,
		`[1]`:           false,
		`"text"`:        false,
		`{"a":1} {}`:    false,
		`{"a":1`:        false,
	} {
		if err := checkKeyValue(s); (err == nil) != ok {
			t.Errorf("checkKeyValue(%s) = %v, want ok %v", s, err, ok)
		}
	}
}

// TestNumericFormat checks the specification's examples of NumericFormat.
func TestNumericFormat(t *testing.T) {
	for _, s := range []string{"-100.2", "-3", "4", "35.2E-7", "1.234"} {
		if !numericFormat.MatchString(s) {
			t.Errorf("%q refused", s)
		}
	}
	for _, s := range []string{"1 1/2", "35.2E+7", "35.24 x 10^7", "[3,5,8]", "sqrt(2)", "2.3^3", "32 GiB", "$32", "3,432,342", "+333", ""} {
		if numericFormat.MatchString(s) {
			t.Errorf("%q accepted", s)
		}
	}
}
