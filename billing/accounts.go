package billing

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"tokenmeter/internal/ident"
)

// The billing accounts file (meterd --billing-accounts) is the operator's
// side of every bill: who issues it (the seller, the names FOCUS files give
// the provider, publisher and invoice issuer, the invoice numbering and
// payment terms) and, per tenant, who pays it (display name, billing account,
// buyer details, tax rate, time zone) and on which contract (rate card,
// volume tiers, commitment, dedicated capacity: contract.go).
//
//	{
//	  "operator": {
//	    "provider_name": "Example Inference", "publisher_name": "Example Inference",
//	    "invoice_issuer_name": "Example Inference Ltd",
//	    "seller": {"name": "Example Inference Ltd", "address": ["1 Main St", "Springfield"],
//	               "tax_id": "US12-3456789", "email": "billing@example.com"},
//	    "invoice_prefix": "EI-", "payment_terms_days": 30
//	  },
//	  "tenants": [
//	    {"id": "acme", "name": "Acme Corp", "zone": "Asia/Kolkata",
//	     "billing_account_id": "acme-billing", "buyer": {"name": "Acme Corp Pvt Ltd", "address": ["..."]},
//	     "tax_name": "GST", "tax_rate": "0.18",
//	     "contract": { ... contract.go ... }}
//	  ]
//	}
//
// Unknown fields are errors. A tenant's zone here and in --billing-zones
// must agree.

// ErrInvalidAccounts is wrapped by every error of ParseAccounts.
var ErrInvalidAccounts = errors.New("invalid billing accounts")

// Accounts is the billing accounts file.
type Accounts struct {
	Operator Operator        `json:"operator"`
	Tenants  []TenantAccount `json:"tenants,omitempty"`
}

// Operator is who runs the service and issues the bills.
type Operator struct {
	// ProviderName, PublisherName and InvoiceIssuerName are the FOCUS
	// columns of the same names; DefaultOperatorName when empty.
	ProviderName      string `json:"provider_name,omitempty"`
	PublisherName     string `json:"publisher_name,omitempty"`
	InvoiceIssuerName string `json:"invoice_issuer_name,omitempty"`
	// Seller is printed on invoices.
	Seller Party `json:"seller"`
	// InvoicePrefix starts every invoice and credit-note number.
	InvoicePrefix string `json:"invoice_prefix,omitempty"`
	// PaymentTermsDays is the days from issue to due date (default 30).
	PaymentTermsDays int `json:"payment_terms_days,omitempty"`
}

// DefaultOperatorName names the provider, publisher and invoice issuer when
// the accounts file names none.
const DefaultOperatorName = "tokenmeter"

// DefaultPaymentTermsDays is the payment term when the file gives none.
const DefaultPaymentTermsDays = 30

// Party is a seller or buyer as an invoice prints it.
type Party struct {
	Name      string   `json:"name,omitempty"`
	LegalName string   `json:"legal_name,omitempty"`
	Address   []string `json:"address,omitempty"`
	TaxID     string   `json:"tax_id,omitempty"`
	Email     string   `json:"email,omitempty"`
}

// TenantAccount is one tenant's billing account.
type TenantAccount struct {
	ID string `json:"id"`
	// Name is the display name (FOCUS BillingAccountName, SubAccountName;
	// the invoice's buyer when Buyer has no name); the id when empty.
	Name string `json:"name,omitempty"`
	// Zone is the billing time zone: an IANA name or an offset ("+05:30").
	Zone string `json:"zone,omitempty"`
	// BillingAccountID is FOCUS BillingAccountId; the tenant id when empty.
	BillingAccountID string `json:"billing_account_id,omitempty"`
	Buyer            Party  `json:"buyer"`
	// TaxName and TaxRate make one tax line on the invoice: the rate is a
	// fraction ("0.18" is 18%), 0 or absent for none.
	TaxName string `json:"tax_name,omitempty"`
	TaxRate Weight `json:"tax_rate,omitempty"`
	// Contract prices the tenant's usage; nil: list prices.
	Contract *Contract `json:"contract,omitempty"`
}

// DisplayName is the tenant's name, or its id.
func (t TenantAccount) DisplayName() string {
	if t.Name != "" {
		return t.Name
	}
	return t.ID
}

// Tenant returns tenant's account: its entry, or a default one (the id as
// its name, no contract) when the file has none.
func (a *Accounts) Tenant(tenant string) TenantAccount {
	if a != nil {
		for _, t := range a.Tenants {
			if t.ID == tenant {
				return t
			}
		}
	}
	return TenantAccount{ID: tenant}
}

// Names returns the provider, publisher and invoice issuer names, with
// DefaultOperatorName for those not set.
func (a *Accounts) Names() (provider, publisher, issuer string) {
	var o Operator
	if a != nil {
		o = a.Operator
	}
	or := func(s string) string {
		if s == "" {
			return DefaultOperatorName
		}
		return s
	}
	return or(o.ProviderName), or(o.PublisherName), or(o.InvoiceIssuerName)
}

// ParseAccounts reads an accounts file and checks it: tenant ids valid and
// unique, zones that load, tax rates in [0, 1), and each contract
// (Contract.validate). Errors wrap ErrInvalidAccounts.
func ParseAccounts(data []byte) (*Accounts, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var a Accounts
	if err := dec.Decode(&a); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidAccounts, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: data after the JSON object", ErrInvalidAccounts)
	}
	var errs []error
	bad := func(path string, err error) {
		errs = append(errs, fmt.Errorf("%w: %s: %v", ErrInvalidAccounts, path, err))
	}
	if a.Operator.PaymentTermsDays < 0 {
		bad("operator.payment_terms_days", errors.New("negative"))
	}
	seen := map[string]bool{}
	for i, t := range a.Tenants {
		path := fmt.Sprintf("tenants[%d]", i)
		if err := ident.Check("tenant_id", t.ID); err != nil {
			bad(path+".id", err)
		}
		if seen[t.ID] {
			bad(path+".id", fmt.Errorf("tenant %q is given twice", t.ID))
		}
		seen[t.ID] = true
		if t.Zone != "" {
			if _, err := ParseZone(t.Zone); err != nil {
				bad(path+".zone", err)
			}
		}
		if t.TaxRate < 0 || t.TaxRate >= Weight(nanosPerUnit) {
			bad(path+".tax_rate", errors.New("want a fraction in [0, 1), such as \"0.18\""))
		}
		if t.Contract != nil {
			for _, err := range t.Contract.validate() {
				bad(path+".contract", err)
			}
		}
	}
	for _, err := range dedicatedOverlaps(a.Tenants) {
		errs = append(errs, fmt.Errorf("%w: %w", ErrInvalidAccounts, err))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &a, nil
}

// dedicatedOverlaps returns an error for each tenant's dedicated entry that
// names a deployment another tenant's dedicated entry names while both are
// in force: each would be billed all the deployment's GPU-hours. An entry
// is in force from its effective_from on, with no end, so two tenants'
// entries of one deployment always overlap (from the later one's start):
// a deployment is dedicated to one tenant in the file. Handing it to
// another tenant takes a new deployment name, or removing the old entry
// once the old tenant's last period with it has closed (a void reissues
// with the file in force).
func dedicatedOverlaps(tenants []TenantAccount) []error {
	type entry struct {
		tenant, path string
		from         time.Time
	}
	first := map[string]entry{}
	var errs []error
	for i, t := range tenants {
		if t.Contract == nil {
			continue
		}
		for j, d := range t.Contract.Dedicated {
			path := fmt.Sprintf("tenants[%d].contract.dedicated[%d].deployment", i, j)
			e, ok := first[d.Deployment]
			if !ok {
				first[d.Deployment] = entry{tenant: t.ID, path: path, from: d.EffectiveFrom}
				continue
			}
			if e.tenant == t.ID {
				continue
			}
			from := d.EffectiveFrom
			if e.from.After(from) {
				from = e.from
			}
			errs = append(errs, fmt.Errorf("%s: %w: deployment %q is dedicated to tenant %q too (%s) from %s on; a deployment is dedicated to one tenant",
				path, ErrInvalidField, d.Deployment, e.tenant, e.path, from.UTC().Format(time.RFC3339)))
		}
	}
	return errs
}

// Zones returns the zones the file sets, by tenant.
func (a *Accounts) Zones() (map[string]*time.Location, error) {
	out := map[string]*time.Location{}
	if a == nil {
		return out, nil
	}
	for _, t := range a.Tenants {
		if t.Zone == "" {
			continue
		}
		z, err := ParseZone(t.Zone)
		if err != nil {
			return nil, fmt.Errorf("%w: tenant %s: %v", ErrInvalidAccounts, t.ID, err)
		}
		out[t.ID] = z
	}
	return out, nil
}
