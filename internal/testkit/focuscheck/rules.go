package focuscheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// Profile says which of the specification's conditions hold for the
// provider and the file (the validator's ApplicabilityCriteria), and what
// the file must tie out to.
type Profile struct {
	// AccountNaming: billing accounts have display names
	// (ACCOUNT_NAMING_SUPPORTED).
	AccountNaming bool
	// Regions: resources run in regions (REGION_SUPPORTED); every Usage
	// row then names its region.
	Regions bool
	// SubAccounts: a sub account construct (SUB_ACCOUNT_SUPPORTED).
	SubAccounts bool
	// UnitPricing: unit prices and price lists (UNIT_PRICING_SUPPORTED,
	// PUBLIC_PRICE_LIST_SUPPORTED): SkuId, SkuPriceId, SkuMeter,
	// SkuPriceDetails and ListUnitPrice.
	UnitPricing bool
	// UsageMeasurement: ConsumedQuantity and ConsumedUnit
	// (USAGE_MEASUREMENT_SUPPORTED).
	UsageMeasurement bool
	// NegotiatedPricing: ContractedUnitPrice (NEGOTIATED_PRICING_SUPPORTED).
	NegotiatedPricing bool
	// Resources: billing by provisioned resources with types
	// (BILLING_BASED_ON_PROVISIONED_RESOURCES_SUPPORTED,
	// RESOURCE_TYPE_ASSIGNMENT_SUPPORTED).
	Resources bool
	// Invoices: the file's charges are invoiced; InvoiceId (RECOMMENDED)
	// is then required and not null.
	Invoices bool
	// Payable is each invoice's payable amount, by BillingAccountId and
	// BillingPeriodStart ("acme 2026-10-01T00:00:00Z"): the sum of
	// BilledCost of the file's rows of each must match it exactly, and
	// every invoice must have rows. Nil: not checked.
	Payable map[string]string
}

// PayableKey is the key of Profile.Payable.
func PayableKey(billingAccountID, billingPeriodStart string) string {
	return billingAccountID + " " + billingPeriodStart
}

// Rule is one requirement of the specification.
type Rule struct {
	// Name is "Section/Requirement": the column or attribute section of
	// the specification and what it requires.
	Name string
	// Spec quotes (or closely paraphrases) the requirement.
	Spec  string
	check func(d *Dataset, p *Profile, r *report)
}

// Check runs the rule on d, returning its violations (at most a few
// messages, then a count).
func (ru Rule) Check(d *Dataset, p Profile) []string {
	r := &report{}
	ru.check(d, &p, r)
	return r.messages()
}

// Run runs every rule on d as a subtest named for the rule.
func Run(t *testing.T, d *Dataset, p Profile) {
	t.Helper()
	for _, ru := range Rules() {
		t.Run(ru.Name, func(t *testing.T) {
			if v := ru.Check(d, p); len(v) > 0 {
				t.Errorf("%s: %s\n  %s", d.Name, ru.Spec, strings.Join(v, "\n  "))
			}
		})
	}
}

// report collects a rule's violations.
type report struct {
	msgs []string
	n    int
}

const maxMessages = 5

func (r *report) add(format string, args ...any) {
	r.n++
	if len(r.msgs) < maxMessages {
		r.msgs = append(r.msgs, fmt.Sprintf(format, args...))
	}
}

func (r *report) row(i int, format string, args ...any) {
	r.add("row %d: %s", i+1, fmt.Sprintf(format, args...))
}

func (r *report) messages() []string {
	if r.n > len(r.msgs) {
		return append(r.msgs, fmt.Sprintf("... %d violations in all", r.n))
	}
	return r.msgs
}

// Data types of FOCUS columns.
const (
	typeDecimal  = "Decimal"
	typeDateTime = "Date/Time"
	typeString   = "String"
	typeJSON     = "JSON"
)

// level is when a column must be present.
type level func(p *Profile) bool

func mandatory(*Profile) bool { return true }

// column is a FOCUS 1.2 column: its data type, whether it may be null, and
// when it must be present.
type column struct {
	name, typ string
	nullable  bool
	present   level
}

// focusColumns are the FOCUS 1.2 columns (specification/columns/*.md,
// "Content constraints"). Recommended columns (ChargeFrequency,
// ServiceSubcategory) are required here; InvoiceId with invoices.
var focusColumns = []column{
	{"AvailabilityZone", typeString, true, nil},
	{"BilledCost", typeDecimal, false, mandatory},
	{"BillingAccountId", typeString, false, mandatory},
	{"BillingAccountName", typeString, true, mandatory},
	{"BillingAccountType", typeString, true, nil},
	{"BillingCurrency", typeString, false, mandatory},
	{"BillingPeriodEnd", typeDateTime, false, mandatory},
	{"BillingPeriodStart", typeDateTime, false, mandatory},
	{"CapacityReservationId", typeString, true, nil},
	{"CapacityReservationStatus", typeString, true, nil},
	{"ChargeCategory", typeString, false, mandatory},
	{"ChargeClass", typeString, true, mandatory},
	{"ChargeDescription", typeString, true, mandatory},
	{"ChargeFrequency", typeString, false, mandatory},
	{"ChargePeriodEnd", typeDateTime, false, mandatory},
	{"ChargePeriodStart", typeDateTime, false, mandatory},
	{"CommitmentDiscountCategory", typeString, true, nil},
	{"CommitmentDiscountId", typeString, true, nil},
	{"CommitmentDiscountName", typeString, true, nil},
	{"CommitmentDiscountQuantity", typeDecimal, true, nil},
	{"CommitmentDiscountStatus", typeString, true, nil},
	{"CommitmentDiscountType", typeString, true, nil},
	{"CommitmentDiscountUnit", typeString, true, nil},
	{"ConsumedQuantity", typeDecimal, true, func(p *Profile) bool { return p.UsageMeasurement }},
	{"ConsumedUnit", typeString, true, func(p *Profile) bool { return p.UsageMeasurement }},
	{"ContractedCost", typeDecimal, false, mandatory},
	{"ContractedUnitPrice", typeDecimal, true, func(p *Profile) bool { return p.NegotiatedPricing }},
	{"EffectiveCost", typeDecimal, false, mandatory},
	{"InvoiceId", typeString, true, func(p *Profile) bool { return p.Invoices }},
	{"InvoiceIssuerName", typeString, false, mandatory},
	{"ListCost", typeDecimal, false, mandatory},
	{"ListUnitPrice", typeDecimal, true, func(p *Profile) bool { return p.UnitPricing }},
	{"PricingCategory", typeString, true, nil},
	{"PricingCurrency", typeString, true, nil},
	{"PricingCurrencyContractedUnitPrice", typeDecimal, true, nil},
	{"PricingCurrencyEffectiveCost", typeDecimal, true, nil},
	{"PricingCurrencyListUnitPrice", typeDecimal, true, nil},
	{"PricingQuantity", typeDecimal, true, mandatory},
	{"PricingUnit", typeString, true, mandatory},
	{"ProviderName", typeString, false, mandatory},
	{"PublisherName", typeString, false, mandatory},
	{"RegionId", typeString, true, func(p *Profile) bool { return p.Regions }},
	{"RegionName", typeString, true, func(p *Profile) bool { return p.Regions }},
	{"ResourceId", typeString, true, func(p *Profile) bool { return p.Resources }},
	{"ResourceName", typeString, true, func(p *Profile) bool { return p.Resources }},
	{"ResourceType", typeString, true, func(p *Profile) bool { return p.Resources }},
	{"ServiceCategory", typeString, false, mandatory},
	{"ServiceName", typeString, false, mandatory},
	{"ServiceSubcategory", typeString, false, mandatory},
	{"SkuId", typeString, true, func(p *Profile) bool { return p.UnitPricing }},
	{"SkuMeter", typeString, true, func(p *Profile) bool { return p.UnitPricing }},
	{"SkuPriceDetails", typeJSON, true, func(p *Profile) bool { return p.UnitPricing }},
	{"SkuPriceId", typeString, true, func(p *Profile) bool { return p.UnitPricing }},
	{"SubAccountId", typeString, true, func(p *Profile) bool { return p.SubAccounts }},
	{"SubAccountName", typeString, true, func(p *Profile) bool { return p.SubAccounts }},
	{"SubAccountType", typeString, true, nil},
	{"Tags", typeJSON, true, nil},
}

var focusColumnSet = func() map[string]column {
	m := map[string]column{}
	for _, c := range focusColumns {
		m[c.name] = c
	}
	return m
}()

var (
	// NumericFormat: an integer, a decimal, or E notation with a sign on
	// the exponent only when negative; no "+", commas, units or symbols.
	numericFormat = regexp.MustCompile(`^-?[0-9]+(\.[0-9]+)?(E-?[0-9]+)?$`)
	// DateTimeFormat: YYYY-MM-DDTHH:mm:ssZ, in UTC.
	dateTimeFormat = regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$`)
	// UnitFormat: an optional whole-number quantity, then capitalized unit
	// words joined by "-" or "/" (e.g. "1000 Tokens", "GB-Hours",
	// "Requests/Day").
	unitFormat = regexp.MustCompile(`^([1-9][0-9]* )?[A-Z][A-Za-z]*([-/]([1-9][0-9]* )?[A-Z][A-Za-z]*)*$`)
	// pascalCase is a Column ID: Pascal case, alphanumeric.
	pascalCase = regexp.MustCompile(`^[A-Z][A-Za-z0-9]*$`)
)

// placeholders are values the NullHandling attribute forbids in place of
// null.
var placeholders = set("N/A", "NA", "n/a", "Not Applicable", "null", "NULL", "Null", "None", "none", "-", "undefined")

// dec parses a numeric cell exactly.
func dec(c Cell) (*big.Rat, bool) {
	if c.Null || !numericFormat.MatchString(c.Text) {
		return nil, false
	}
	return new(big.Rat).SetString(c.Text)
}

// Row predicates.
func category(d *Dataset, i int) string { return d.Get(i, "ChargeCategory").Text }
func correction(d *Dataset, i int) bool { return d.Get(i, "ChargeClass").Text == "Correction" }
func isTax(d *Dataset, i int) bool      { return category(d, i) == "Tax" }

// usageOrPurchase is a Usage or Purchase row that is not a correction:
// the rows on which prices, quantities and SKUs must not be null.
func usageOrPurchase(d *Dataset, i int) bool {
	c := category(d, i)
	return (c == "Usage" || c == "Purchase") && !correction(d, i)
}

// Rules are the checks, in the specification's order: attributes, then
// columns alphabetically.
func Rules() []Rule {
	var rules []Rule
	add := func(name, spec string, check func(d *Dataset, p *Profile, r *report)) {
		rules = append(rules, Rule{Name: name, Spec: spec, check: check})
	}

	// Attributes.
	add("ColumnHandling/CustomColumnsPrefixed", "custom columns MUST be prefixed with x_; FOCUS Column IDs are Pascal case",
		func(d *Dataset, _ *Profile, r *report) {
			for _, c := range d.Columns {
				if _, ok := focusColumnSet[c]; !ok && !strings.HasPrefix(c, "x_") {
					r.add("column %q is neither a FOCUS 1.2 column nor prefixed x_", c)
				}
				if _, ok := focusColumnSet[c]; ok && !pascalCase.MatchString(c) {
					r.add("column %q is not Pascal case", c)
				}
			}
		})
	add("ColumnHandling/FocusColumnsFirst", "FOCUS columns SHOULD be first; custom columns SHOULD be after all FOCUS columns",
		func(d *Dataset, _ *Profile, r *report) {
			seenCustom := ""
			for _, c := range d.Columns {
				if strings.HasPrefix(c, "x_") {
					if seenCustom == "" {
						seenCustom = c
					}
				} else if seenCustom != "" {
					r.add("FOCUS column %s after custom column %s", c, seenCustom)
				}
			}
		})
	add("NullHandling/NoPlaceholders", "columns MUST NOT use empty strings or placeholder values (\"Not Applicable\") for null",
		func(d *Dataset, _ *Profile, r *report) {
			for c, name := range d.Columns {
				col, ok := focusColumnSet[name]
				if !ok || col.typ != typeString {
					continue
				}
				for i, row := range d.Rows {
					v := row[c]
					switch {
					case v.Null:
					case placeholders[v.Text]:
						r.row(i, "%s is the placeholder %q", name, v.Text)
					case d.Format == "parquet" && v.Text == "":
						r.row(i, "%s is an empty string, not null", name)
					}
				}
			}
		})
	add("StringHandling/NotBlank", "empty strings and strings of spaces only SHOULD NOT be used in not-nullable string columns",
		func(d *Dataset, _ *Profile, r *report) {
			for c, name := range d.Columns {
				col, ok := focusColumnSet[name]
				if !ok || col.typ != typeString || col.nullable {
					continue
				}
				for i, row := range d.Rows {
					if !row[c].Null && strings.TrimSpace(row[c].Text) == "" {
						r.row(i, "%s is blank", name)
					}
				}
			}
		})
	add("Metadata/FocusVersion", "FocusVersion MUST be provided in the metadata and match the version the dataset conforms to (1.2); DataGenerator MUST be provided",
		func(d *Dataset, _ *Profile, r *report) {
			got := map[string]string{}
			for k, v := range d.Metadata {
				got[normalizeKey(k)] = v
			}
			if v, ok := got["focusversion"]; !ok {
				r.add("no FocusVersion in the metadata %v", d.Metadata)
			} else if v != "1.2" {
				r.add("FocusVersion %q, want 1.2", v)
			}
			if v, ok := got["datagenerator"]; !ok || strings.TrimSpace(v) == "" {
				r.add("no DataGenerator in the metadata %v", d.Metadata)
			}
		})

	// Presence and types of every column.
	for _, col := range focusColumns {
		if col.present != nil {
			add(col.name+"/Present", col.name+" MUST be present in a FOCUS dataset (for this provider)",
				func(d *Dataset, p *Profile, r *report) {
					if col.present(p) && !d.Has(col.name) {
						r.add("column %s is missing", col.name)
					}
				})
		}
		switch col.typ {
		case typeDecimal:
			add(col.name+"/TypeDecimal", col.name+" MUST be of type Decimal and conform to NumericFormat",
				func(d *Dataset, _ *Profile, r *report) {
					if !d.Has(col.name) {
						return
					}
					if k := d.Kind(col.name); k != KindText && k != KindDecimal && k != KindFloat && k != KindInteger {
						r.add("column %s is stored as %s, not a decimal", col.name, k)
					}
					valuesAre(d, r, col.name, numericFormat.MatchString, "is not in NumericFormat")
				})
		case typeDateTime:
			add(col.name+"/TypeDateTime", col.name+" MUST be of type Date/Time in DateTimeFormat (UTC, YYYY-MM-DDTHH:mm:ssZ)",
				func(d *Dataset, _ *Profile, r *report) {
					if !d.Has(col.name) {
						return
					}
					switch k := d.Kind(col.name); k {
					case KindTimestamp, KindString:
					case KindText:
					default:
						r.add("column %s is stored as %s, not a UTC timestamp", col.name, k)
					}
					valuesAre(d, r, col.name, dateTimeFormat.MatchString, "is not YYYY-MM-DDTHH:mm:ssZ")
				})
		case typeString:
			add(col.name+"/TypeString", col.name+" MUST be of type String",
				func(d *Dataset, _ *Profile, r *report) {
					if k := d.Kind(col.name); d.Has(col.name) && k != KindText && k != KindString {
						r.add("column %s is stored as %s, not a string", col.name, k)
					}
				})
		case typeJSON:
			add(col.name+"/KeyValueFormat", col.name+" MUST be a JSON object with unique keys whose values are numbers, strings, true, false or null",
				func(d *Dataset, _ *Profile, r *report) {
					for i := range d.Rows {
						if v := d.Get(i, col.name); !v.Null {
							if err := checkKeyValue(v.Text); err != nil {
								r.row(i, "%s %s: %v", col.name, v.Text, err)
							}
						}
					}
				})
		}
		if !col.nullable {
			add(col.name+"/NotNull", col.name+" MUST NOT be null",
				func(d *Dataset, _ *Profile, r *report) {
					if !d.Has(col.name) {
						return
					}
					for i := range d.Rows {
						if d.Get(i, col.name).Null {
							r.row(i, "%s is null", col.name)
						}
					}
				})
		}
	}

	// Column requirements beyond presence, type and nulls.
	add("BilledCost/InvoiceTotal", "the sum of BilledCost for an invoice MUST match the payable amount of the invoice",
		func(d *Dataset, p *Profile, r *report) {
			if p.Payable == nil {
				return
			}
			sums := map[string]*big.Rat{}
			for i := range d.Rows {
				k := PayableKey(d.Get(i, "BillingAccountId").Text, d.Get(i, "BillingPeriodStart").Text)
				v, ok := dec(d.Get(i, "BilledCost"))
				if !ok {
					continue
				}
				if sums[k] == nil {
					sums[k] = new(big.Rat)
				}
				sums[k].Add(sums[k], v)
			}
			for _, k := range sortedKeys(p.Payable) {
				want, ok := new(big.Rat).SetString(p.Payable[k])
				if !ok {
					r.add("payable %q of %s is not a number", p.Payable[k], k)
					continue
				}
				got := sums[k]
				if got == nil {
					r.add("invoice %s (payable %s) has no rows", k, p.Payable[k])
				} else if got.Cmp(want) != 0 {
					r.add("invoice %s: BilledCost sums to %s, payable %s", k, got.FloatString(9), p.Payable[k])
				}
			}
			for _, k := range sortedKeys(sums) {
				if _, ok := p.Payable[k]; !ok {
					r.add("rows of %s, which is no invoice", k)
				}
			}
		})
	add("BillingAccountId/OneName", "BillingAccountId MUST be a unique identifier: one billing account, one name",
		func(d *Dataset, _ *Profile, r *report) { oneTo(d, r, "BillingAccountId", "BillingAccountName", nil) })
	add("BillingAccountName/NotNull", "BillingAccountName MUST NOT be null when the provider supports display names for billing accounts",
		func(d *Dataset, p *Profile, r *report) {
			if p.AccountNaming {
				notNullWhen(d, r, "BillingAccountName", nil)
			}
		})
	add("BillingCurrency/NationalCurrency", "BillingCurrency MUST be an ISO 4217 national currency code",
		func(d *Dataset, _ *Profile, r *report) {
			valuesAre(d, r, "BillingCurrency", func(v string) bool { return nationalCurrencies[v] }, "is not an ISO 4217 code")
		})
	add("BillingCurrency/OnePerInvoice", "BillingCurrency MUST match the currency of the invoice: one per billing account and period",
		func(d *Dataset, _ *Profile, r *report) {
			seen := map[string]string{}
			for i := range d.Rows {
				k := PayableKey(d.Get(i, "BillingAccountId").Text, d.Get(i, "BillingPeriodStart").Text)
				c := d.Get(i, "BillingCurrency").Text
				if was, ok := seen[k]; ok && was != c {
					r.row(i, "%s billed in %s and %s", k, was, c)
				}
				seen[k] = c
			}
		})
	add("BillingPeriod/StartBeforeEnd", "BillingPeriodStart is the inclusive start and BillingPeriodEnd the exclusive end of the billing period",
		func(d *Dataset, _ *Profile, r *report) {
			startBeforeEnd(d, r, "BillingPeriodStart", "BillingPeriodEnd")
		})
	add("ChargeCategory/AllowedValues", "ChargeCategory MUST be one of Usage, Purchase, Tax, Credit, Adjustment",
		func(d *Dataset, _ *Profile, r *report) { allowed(d, r, "ChargeCategory", chargeCategories) })
	add("ChargeClass/AllowedValues", "ChargeClass MUST be \"Correction\" when not null",
		func(d *Dataset, _ *Profile, r *report) { allowed(d, r, "ChargeClass", set("Correction")) })
	add("ChargeClass/CorrectionOfEarlierPeriod", "ChargeClass MUST NOT be null for a correction to a previously invoiced billing period and MUST be null otherwise",
		func(d *Dataset, _ *Profile, r *report) {
			for i := range d.Rows {
				cs, bs := d.Get(i, "ChargePeriodStart"), d.Get(i, "BillingPeriodStart")
				if cs.Null || bs.Null {
					continue
				}
				earlier := cs.Text < bs.Text // same layout: text order is time order
				switch {
				case earlier && !correction(d, i):
					r.row(i, "charge period from %s, before its billing period (%s), but ChargeClass is not Correction", cs.Text, bs.Text)
				case !earlier && correction(d, i):
					r.row(i, "ChargeClass Correction on a charge of its own billing period (%s)", cs.Text)
				}
			}
		})
	add("ChargeDescription/NotNull", "ChargeDescription SHOULD NOT be null",
		func(d *Dataset, _ *Profile, r *report) { notNullWhen(d, r, "ChargeDescription", nil) })
	add("ChargeFrequency/AllowedValues", "ChargeFrequency MUST be one of One-Time, Recurring, Usage-Based",
		func(d *Dataset, _ *Profile, r *report) { allowed(d, r, "ChargeFrequency", chargeFrequencies) })
	add("ChargeFrequency/NotUsageBasedForPurchase", "ChargeFrequency MUST NOT be \"Usage-Based\" when ChargeCategory is \"Purchase\"",
		func(d *Dataset, _ *Profile, r *report) {
			for i := range d.Rows {
				if category(d, i) == "Purchase" && d.Get(i, "ChargeFrequency").Text == "Usage-Based" {
					r.row(i, "a Purchase is Usage-Based")
				}
			}
		})
	add("ChargePeriod/StartBeforeEnd", "ChargePeriodStart is the inclusive start and ChargePeriodEnd the exclusive end of the charge",
		func(d *Dataset, _ *Profile, r *report) { startBeforeEnd(d, r, "ChargePeriodStart", "ChargePeriodEnd") })
	add("ChargePeriod/WithinBillingPeriod", "a charge of the billing period (not a Correction of an earlier one) lies within its billing period",
		func(d *Dataset, _ *Profile, r *report) {
			for i := range d.Rows {
				if correction(d, i) {
					continue
				}
				cs, ce := d.Get(i, "ChargePeriodStart").Text, d.Get(i, "ChargePeriodEnd").Text
				bs, be := d.Get(i, "BillingPeriodStart").Text, d.Get(i, "BillingPeriodEnd").Text
				if cs < bs || ce > be {
					r.row(i, "charge period %s to %s outside billing period %s to %s", cs, ce, bs, be)
				}
			}
		})
	add("CommitmentDiscountCategory/AllowedValues", "CommitmentDiscountCategory MUST be Spend or Usage",
		func(d *Dataset, _ *Profile, r *report) {
			allowed(d, r, "CommitmentDiscountCategory", commitmentDiscountCategories)
		})
	add("CommitmentDiscountStatus/AllowedValues", "CommitmentDiscountStatus MUST be Used or Unused",
		func(d *Dataset, _ *Profile, r *report) {
			allowed(d, r, "CommitmentDiscountStatus", commitmentDiscountStatuses)
		})
	add("CapacityReservationStatus/AllowedValues", "CapacityReservationStatus MUST be Used or Unused",
		func(d *Dataset, _ *Profile, r *report) {
			allowed(d, r, "CapacityReservationStatus", capacityReservationStatuses)
		})
	add("ConsumedQuantity/NullUnlessUsage", "ConsumedQuantity MUST be null when ChargeCategory is not \"Usage\" (or the commitment is Unused)",
		func(d *Dataset, _ *Profile, r *report) {
			nullWhen(d, r, "ConsumedQuantity", func(i int) bool {
				return category(d, i) != "Usage" || d.Get(i, "CommitmentDiscountStatus").Text == "Unused"
			})
		})
	add("ConsumedQuantity/NotNullForUsage", "ConsumedQuantity MUST NOT be null when ChargeCategory is \"Usage\" and ChargeClass is not \"Correction\"",
		func(d *Dataset, _ *Profile, r *report) {
			notNullWhen(d, r, "ConsumedQuantity", func(i int) bool {
				return category(d, i) == "Usage" && !correction(d, i) && d.Get(i, "CommitmentDiscountStatus").Text != "Unused"
			})
		})
	add("ConsumedUnit/NullWithConsumedQuantity", "ConsumedUnit MUST be null when ConsumedQuantity is null and MUST NOT be null otherwise",
		func(d *Dataset, _ *Profile, r *report) { nullIff(d, r, "ConsumedUnit", "ConsumedQuantity") })
	add("ConsumedUnit/UnitFormat", "ConsumedUnit SHOULD conform to UnitFormat",
		func(d *Dataset, _ *Profile, r *report) { unitFormatted(d, r, "ConsumedUnit") })
	add("ContractedCost/UnitPriceTimesQuantity", "ContractedUnitPrice × PricingQuantity MUST match ContractedCost when both are not null and ChargeClass is not \"Correction\"",
		func(d *Dataset, _ *Profile, r *report) { product(d, r, "ContractedUnitPrice", "ContractedCost") })
	add("ContractedCost/MatchesBilledCostOfCredits", "ContractedCost of a charge unrelated to other charges (a Credit) with no ContractedUnitPrice MUST match BilledCost",
		func(d *Dataset, _ *Profile, r *report) { matchesBilled(d, r, "ContractedCost", "ContractedUnitPrice") })
	add("ContractedUnitPrice/Nullability", "ContractedUnitPrice MUST be null for Tax and MUST NOT be null for Usage and Purchase (not Correction)",
		func(d *Dataset, p *Profile, r *report) { priceNullability(d, r, "ContractedUnitPrice") })
	add("ContractedUnitPrice/NonNegative", "ContractedUnitPrice MUST be a non-negative decimal",
		func(d *Dataset, _ *Profile, r *report) { nonNegative(d, r, "ContractedUnitPrice") })
	add("EffectiveCost/MatchesBilledCostOfCredits", "EffectiveCost of a charge unrelated to other charges (a Credit) MUST match BilledCost",
		func(d *Dataset, _ *Profile, r *report) { matchesBilled(d, r, "EffectiveCost", "") })
	add("InvoiceId/NotNullWhenInvoiced", "InvoiceId MUST NOT be null when the charge is associated with an issued or provisional invoice",
		func(d *Dataset, p *Profile, r *report) {
			if p.Invoices {
				notNullWhen(d, r, "InvoiceId", nil)
			}
		})
	add("InvoiceId/OneBillingAccount", "InvoiceId MUST be associated with the related charge and BillingAccountId: one invoice, one account and period",
		func(d *Dataset, _ *Profile, r *report) {
			seen := map[string]string{}
			for i := range d.Rows {
				id := d.Get(i, "InvoiceId")
				if id.Null {
					continue
				}
				k := PayableKey(d.Get(i, "BillingAccountId").Text, d.Get(i, "BillingPeriodStart").Text)
				if was, ok := seen[id.Text]; ok && was != k {
					r.row(i, "invoice %s of %s and of %s", id.Text, was, k)
				}
				seen[id.Text] = k
			}
		})
	add("ListCost/UnitPriceTimesQuantity", "ListUnitPrice × PricingQuantity MUST match ListCost when both are not null and ChargeClass is not \"Correction\"",
		func(d *Dataset, _ *Profile, r *report) { product(d, r, "ListUnitPrice", "ListCost") })
	add("ListCost/MatchesBilledCostOfCredits", "ListCost of a charge unrelated to other charges (a Credit) with no ListUnitPrice MUST match BilledCost",
		func(d *Dataset, _ *Profile, r *report) { matchesBilled(d, r, "ListCost", "ListUnitPrice") })
	add("ListUnitPrice/Nullability", "ListUnitPrice MUST be null for Tax and MUST NOT be null for Usage and Purchase (not Correction)",
		func(d *Dataset, _ *Profile, r *report) { priceNullability(d, r, "ListUnitPrice") })
	add("ListUnitPrice/NonNegative", "ListUnitPrice MUST be a non-negative decimal",
		func(d *Dataset, _ *Profile, r *report) { nonNegative(d, r, "ListUnitPrice") })
	add("PricingCategory/AllowedValues", "PricingCategory MUST be one of Standard, Dynamic, Committed, Other",
		func(d *Dataset, _ *Profile, r *report) { allowed(d, r, "PricingCategory", pricingCategories) })
	add("PricingCategory/Nullability", "PricingCategory MUST be null for Tax and MUST NOT be null for Usage and Purchase (not Correction)",
		func(d *Dataset, _ *Profile, r *report) { priceNullability(d, r, "PricingCategory") })
	add("PricingQuantity/Nullability", "PricingQuantity MUST be null for Tax and MUST NOT be null for Usage and Purchase (not Correction)",
		func(d *Dataset, _ *Profile, r *report) { priceNullability(d, r, "PricingQuantity") })
	add("PricingUnit/NullWithPricingQuantity", "PricingUnit MUST be null when PricingQuantity is null and MUST NOT be null otherwise",
		func(d *Dataset, _ *Profile, r *report) { nullIff(d, r, "PricingUnit", "PricingQuantity") })
	add("PricingUnit/UnitFormat", "PricingUnit SHOULD conform to UnitFormat",
		func(d *Dataset, _ *Profile, r *report) { unitFormatted(d, r, "PricingUnit") })
	add("RegionId/NotNullForRegionalUsage", "RegionId MUST NOT be null when the resource or service is operated in a distinct region",
		func(d *Dataset, p *Profile, r *report) {
			if p.Regions {
				notNullWhen(d, r, "RegionId", func(i int) bool { return category(d, i) == "Usage" })
			}
		})
	add("RegionName/NullWithRegionId", "RegionName MUST be null when RegionId is null and MUST NOT be null otherwise",
		func(d *Dataset, _ *Profile, r *report) { nullIff(d, r, "RegionName", "RegionId") })
	add("RegionId/OneName", "RegionId is an immutable identifier: one region, one name",
		func(d *Dataset, _ *Profile, r *report) { oneTo(d, r, "RegionId", "RegionName", nil) })
	add("ResourceName/NullWithoutResourceId", "ResourceName MUST be null when ResourceId is null",
		func(d *Dataset, _ *Profile, r *report) {
			nullWhen(d, r, "ResourceName", func(i int) bool { return d.Get(i, "ResourceId").Null })
		})
	add("ResourceType/NullWithResourceId", "ResourceType MUST be null when ResourceId is null and MUST NOT be null otherwise",
		func(d *Dataset, _ *Profile, r *report) { nullIff(d, r, "ResourceType", "ResourceId") })
	add("ServiceCategory/AllowedValues", "ServiceCategory MUST be one of the allowed values",
		func(d *Dataset, _ *Profile, r *report) { allowed(d, r, "ServiceCategory", serviceCategories) })
	add("ServiceName/OneServiceCategory", "ServiceName MUST have one and only one ServiceCategory",
		func(d *Dataset, _ *Profile, r *report) { oneTo(d, r, "ServiceName", "ServiceCategory", nil) })
	add("ServiceSubcategory/AllowedValuesAndParent", "ServiceSubcategory MUST be one of the allowed values, with its one parent ServiceCategory",
		func(d *Dataset, _ *Profile, r *report) {
			for i := range d.Rows {
				v := d.Get(i, "ServiceSubcategory")
				if v.Null {
					continue
				}
				parent, ok := serviceSubcategories[v.Text]
				switch {
				case !ok:
					r.row(i, "ServiceSubcategory %q is not an allowed value", v.Text)
				case parent != d.Get(i, "ServiceCategory").Text:
					r.row(i, "ServiceSubcategory %q belongs to %q, not %q", v.Text, parent, d.Get(i, "ServiceCategory").Text)
				}
			}
		})
	add("SkuId/Nullability", "SkuId MUST be null for Tax and MUST NOT be null for Usage and Purchase (not Correction)",
		func(d *Dataset, _ *Profile, r *report) { priceNullability(d, r, "SkuId") })
	add("SkuMeter/NullWithoutSkuId", "SkuMeter MUST be null when SkuId is null and SHOULD NOT be null otherwise",
		func(d *Dataset, _ *Profile, r *report) { nullIff(d, r, "SkuMeter", "SkuId") })
	add("SkuMeter/ConsistentPerSkuId", "SkuMeter SHOULD remain consistent over time for a given SkuId",
		func(d *Dataset, _ *Profile, r *report) { oneTo(d, r, "SkuId", "SkuMeter", nil) })
	add("SkuPriceDetails/NullWithoutSkuPriceId", "SkuPriceDetails MUST be null when SkuPriceId is null",
		func(d *Dataset, _ *Profile, r *report) {
			nullWhen(d, r, "SkuPriceDetails", func(i int) bool { return d.Get(i, "SkuPriceId").Null })
		})
	add("SkuPriceDetails/PropertyKeys", "SkuPriceDetails keys MUST begin with x_ unless FOCUS-defined; FOCUS-defined numeric properties hold numbers",
		func(d *Dataset, _ *Profile, r *report) {
			for i := range d.Rows {
				v := d.Get(i, "SkuPriceDetails")
				if v.Null {
					continue
				}
				var props map[string]any
				if json.Unmarshal([]byte(v.Text), &props) != nil {
					continue // KeyValueFormat reports it
				}
				for _, k := range sortedKeys(props) {
					numeric, defined := skuPriceProperties[k]
					switch {
					case !defined && !strings.HasPrefix(k, "x_"):
						r.row(i, "SkuPriceDetails key %q is neither FOCUS-defined nor prefixed x_", k)
					case defined && numeric:
						if _, ok := props[k].(float64); !ok {
							r.row(i, "SkuPriceDetails %s = %v is not a number", k, props[k])
						}
					}
				}
			}
		})
	add("SkuPriceDetails/OnePerSkuPriceId", "SkuPriceDetails MUST be associated with a given SkuPriceId: one SkuPriceId, one set of details",
		func(d *Dataset, _ *Profile, r *report) { oneTo(d, r, "SkuPriceId", "SkuPriceDetails", nil) })
	add("SkuPriceId/Nullability", "SkuPriceId MUST be null for Tax and MUST NOT be null for Usage and Purchase (not Correction)",
		func(d *Dataset, _ *Profile, r *report) { priceNullability(d, r, "SkuPriceId") })
	add("SkuPriceId/OneParentSkuId", "SkuPriceId MUST have one and only one parent SkuId",
		func(d *Dataset, _ *Profile, r *report) { oneTo(d, r, "SkuPriceId", "SkuId", nil) })
	add("SkuPriceId/OneListUnitPrice", "SkuPriceId MUST reference one SKU Price and support the lookup of its ListUnitPrice: one SkuPriceId, one ListUnitPrice",
		func(d *Dataset, _ *Profile, r *report) {
			oneTo(d, r, "SkuPriceId", "ListUnitPrice", func(i int) bool { return !correction(d, i) })
		})
	for _, c := range [][2]string{
		{"BillingAccountType", "BillingAccountId"}, {"SubAccountType", "SubAccountId"},
		{"CommitmentDiscountCategory", "CommitmentDiscountId"}, {"CommitmentDiscountType", "CommitmentDiscountId"},
	} {
		add(c[0]+"/NullWith"+c[1], c[0]+" MUST be null when "+c[1]+" is null and MUST NOT be null otherwise",
			func(d *Dataset, _ *Profile, r *report) {
				if d.Has(c[0]) {
					nullIff(d, r, c[0], c[1])
				}
			})
	}
	for _, c := range [][2]string{
		{"CommitmentDiscountName", "CommitmentDiscountId"}, {"CommitmentDiscountStatus", "CommitmentDiscountId"},
		{"CapacityReservationStatus", "CapacityReservationId"},
	} {
		add(c[0]+"/NullWithout"+c[1], c[0]+" MUST be null when "+c[1]+" is null",
			func(d *Dataset, _ *Profile, r *report) {
				nullWhen(d, r, c[0], func(i int) bool { return d.Get(i, c[1]).Null })
			})
	}
	add("SubAccountName/NullWithSubAccountId", "SubAccountName MUST be null when SubAccountId is null and MUST NOT be null otherwise",
		func(d *Dataset, _ *Profile, r *report) { nullIff(d, r, "SubAccountName", "SubAccountId") })
	return rules
}

func normalizeKey(k string) string {
	var b strings.Builder
	for _, c := range strings.ToLower(k) {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' {
			b.WriteRune(c)
		}
	}
	s := b.String()
	// "focus.version" and "FocusVersion" alike; a namespace before the
	// name ("x_focus_version") is allowed.
	for _, name := range []string{"focusversion", "datagenerator"} {
		if strings.HasSuffix(s, name) {
			return name
		}
	}
	return s
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// checkKeyValue checks the KeyValueFormat attribute: a JSON object, keys
// unique, values scalars.
func checkKeyValue(s string) error {
	dec := json.NewDecoder(bytes.NewReader([]byte(s)))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok != json.Delim('{') {
		return fmt.Errorf("not a JSON object")
	}
	keys := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		k := tok.(string)
		if keys[k] {
			return fmt.Errorf("key %q twice", k)
		}
		keys[k] = true
		v, err := dec.Token()
		if err != nil {
			return err
		}
		if _, ok := v.(json.Delim); ok {
			return fmt.Errorf("value of %q is an object or an array", k)
		}
	}
	if _, err := dec.Token(); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("text after the object")
	}
	return nil
}

func allowed(d *Dataset, r *report, col string, values map[string]bool) {
	valuesAre(d, r, col, func(v string) bool { return values[v] }, "is not an allowed value")
}

// valuesAre reports each non-null value of col that good refuses, as
// `col "value" isNot`.
func valuesAre(d *Dataset, r *report, col string, good func(string) bool, isNot string) {
	for i := range d.Rows {
		if v := d.Get(i, col); !v.Null && !good(v.Text) {
			r.row(i, "%s %q %s", col, v.Text, isNot)
		}
	}
}

// notNullWhen reports rows where col is null and when (nil: always) holds;
// a missing column is left to the presence rules.
func notNullWhen(d *Dataset, r *report, col string, when func(int) bool) {
	if !d.Has(col) {
		return
	}
	for i := range d.Rows {
		if (when == nil || when(i)) && d.Get(i, col).Null {
			r.row(i, "%s is null (ChargeCategory %s, ChargeClass %q)", col, category(d, i), d.Get(i, "ChargeClass").Text)
		}
	}
}

func nullWhen(d *Dataset, r *report, col string, when func(int) bool) {
	for i := range d.Rows {
		if v := d.Get(i, col); !v.Null && when(i) {
			r.row(i, "%s is %q, want null (ChargeCategory %s)", col, v.Text, category(d, i))
		}
	}
}

// nullIff reports rows where col is null and other not, or the reverse.
func nullIff(d *Dataset, r *report, col, other string) {
	if !d.Has(col) && !d.Has(other) {
		return
	}
	for i := range d.Rows {
		a, b := d.Get(i, col), d.Get(i, other)
		if a.Null != b.Null {
			r.row(i, "%s %q but %s %q", col, nullText(a), other, nullText(b))
		}
	}
}

func nullText(c Cell) string {
	if c.Null {
		return "<null>"
	}
	return c.Text
}

// priceNullability is the rule shared by the price, quantity and SKU
// columns: null for Tax, not null for Usage and Purchase that are not
// corrections.
func priceNullability(d *Dataset, r *report, col string) {
	nullWhen(d, r, col, func(i int) bool { return isTax(d, i) })
	notNullWhen(d, r, col, func(i int) bool { return usageOrPurchase(d, i) })
}

func nonNegative(d *Dataset, r *report, col string) {
	for i := range d.Rows {
		if v, ok := dec(d.Get(i, col)); ok && v.Sign() < 0 {
			r.row(i, "%s %s is negative", col, d.Get(i, col).Text)
		}
	}
}

// product checks unit price × PricingQuantity = cost, exactly.
func product(d *Dataset, r *report, price, cost string) {
	for i := range d.Rows {
		if correction(d, i) {
			continue
		}
		up, ok1 := dec(d.Get(i, price))
		q, ok2 := dec(d.Get(i, "PricingQuantity"))
		c, ok3 := dec(d.Get(i, cost))
		if !ok1 || !ok2 || !ok3 {
			continue
		}
		if got := new(big.Rat).Mul(up, q); got.Cmp(c) != 0 {
			r.row(i, "%s %s × PricingQuantity %s = %s, %s %s", price, d.Get(i, price).Text, d.Get(i, "PricingQuantity").Text,
				exactText(got), cost, d.Get(i, cost).Text)
		}
	}
}

// exactText writes r as a decimal when it has a finite one.
func exactText(r *big.Rat) string {
	for digits := 0; digits <= 40; digits++ {
		s := r.FloatString(digits)
		if v, ok := new(big.Rat).SetString(s); ok && v.Cmp(r) == 0 {
			return s
		}
	}
	return r.RatString()
}

// matchesBilled checks that cost equals BilledCost on Credit rows (charges
// unrelated to others) whose unitPrice column (none: "") is null.
func matchesBilled(d *Dataset, r *report, cost, unitPrice string) {
	for i := range d.Rows {
		if category(d, i) != "Credit" || (unitPrice != "" && !d.Get(i, unitPrice).Null) {
			continue
		}
		c, ok1 := dec(d.Get(i, cost))
		b, ok2 := dec(d.Get(i, "BilledCost"))
		if ok1 && ok2 && c.Cmp(b) != 0 {
			r.row(i, "Credit with %s %s, BilledCost %s", cost, d.Get(i, cost).Text, d.Get(i, "BilledCost").Text)
		}
	}
}

// oneTo checks that each non-null key has one value of col (nulls count as
// a value), over the rows where when (nil: all) holds. Decimal values are
// compared as numbers.
func oneTo(d *Dataset, r *report, key, col string, when func(int) bool) {
	if !d.Has(key) || !d.Has(col) {
		return
	}
	seen := map[string]string{}
	for i := range d.Rows {
		k := d.Get(i, key)
		if k.Null || (when != nil && !when(i)) {
			continue
		}
		v := d.Get(i, col)
		text := nullText(v)
		if n, ok := dec(v); ok && focusColumnSet[col].typ == typeDecimal {
			text = exactText(n)
		}
		if was, ok := seen[k.Text]; ok && was != text {
			r.row(i, "%s %s has %s %s and %s", key, k.Text, col, was, text)
			continue
		}
		seen[k.Text] = text
	}
}

func startBeforeEnd(d *Dataset, r *report, start, end string) {
	for i := range d.Rows {
		s, e := d.Get(i, start), d.Get(i, end)
		if !s.Null && !e.Null && s.Text >= e.Text {
			r.row(i, "%s %s is not before %s %s", start, s.Text, end, e.Text)
		}
	}
}

func unitFormatted(d *Dataset, r *report, col string) {
	valuesAre(d, r, col, unitFormat.MatchString, "is not in UnitFormat")
}
