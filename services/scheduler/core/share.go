package core

import (
	"fmt"
	"strings"

	"github.com/sluice-dtr/sluice/pkg/dtr"
)

// DefaultShare is the share of DTRs that the share policy cannot place.
const DefaultShare = "_default"

// SharePolicy names the share a DTR belongs to, from its owner's identity.
type SharePolicy string

// The share policies of ARC's `sharepolicy` option.
const (
	PolicyNone      SharePolicy = ""
	PolicyDN        SharePolicy = "dn"
	PolicyVOMSVO    SharePolicy = "voms:vo"
	PolicyVOMSGroup SharePolicy = "voms:group"
	PolicyVOMSRole  SharePolicy = "voms:role"
)

// ParseSharePolicy checks a configured policy name.
func ParseSharePolicy(s string) (SharePolicy, error) {
	switch p := SharePolicy(strings.ToLower(strings.TrimSpace(s))); p {
	case PolicyNone, PolicyDN, PolicyVOMSVO, PolicyVOMSGroup, PolicyVOMSRole, PolicyActivity,
		PolicyDN + activitySuffix, PolicyVOMSVO + activitySuffix, PolicyVOMSGroup + activitySuffix, PolicyVOMSRole + activitySuffix:
		return p, nil
	case "none":
		return PolicyNone, nil
	}
	return "", fmt.Errorf("share policy %q is not one of dn, voms:vo, voms:group, voms:role, none, activity, or one of the first four with +activity (voms:vo+activity)", s)
}

// ShareName returns the share of an identity under the policy, without the
// direction suffix (ARC's transfer share names):
//
//	dn          the DN
//	voms:vo     the VO of the first FQAN
//	voms:group  "vo:group" for /vo/group[/sub...], else "vo:null"
//	voms:role   "vo:X" for /vo/.../Role=X, else "vo:null"
//	none        _default
//
// An identity that lacks what the policy needs goes to _default.
//
// Under an activity policy (voms:vo+activity) it is the identity's part of
// the share's name; ShareOf adds the activity.
func (p SharePolicy) ShareName(id dtr.Identity) string {
	switch p = p.identity(); p {
	case PolicyDN:
		if id.DN != "" {
			return id.DN
		}
	case PolicyVOMSVO, PolicyVOMSGroup, PolicyVOMSRole:
		if len(id.FQANs) == 0 {
			break
		}
		vo, groups, role := parseFQAN(id.FQANs[0])
		if vo == "" {
			break
		}
		switch p {
		case PolicyVOMSVO:
			return vo
		case PolicyVOMSGroup:
			if groups == "" {
				return vo + ":null"
			}
			return vo + ":" + groups
		case PolicyVOMSRole:
			if role == "" || strings.EqualFold(role, "NULL") {
				return vo + ":null"
			}
			return vo + ":" + role
		}
	}
	return DefaultShare
}

// parseFQAN splits "/vo/g1/g2/Role=r/Capability=c" into "vo", "g1/g2", "r".
func parseFQAN(fqan string) (vo, groups, role string) {
	var gs []string
	for i, part := range strings.Split(strings.Trim(fqan, "/"), "/") {
		switch {
		case part == "":
		case strings.HasPrefix(part, "Role="):
			role = strings.TrimPrefix(part, "Role=")
		case strings.HasPrefix(part, "Capability="):
		case i == 0:
			vo = part
		default:
			gs = append(gs, part)
		}
	}
	return vo, strings.Join(gs, "/"), role
}

// SubShare appends the direction to a share name: "atlas-download".
func SubShare(share string, dir dtr.Direction) string {
	if dir == "" {
		return share
	}
	return share + "-" + string(dir)
}

// DTRPriority is clamp(int(share × user / 100), 1, 100); a user priority of
// 0 means the default, 50.
func DTRPriority(sharePriority, userPriority int) int {
	if userPriority == 0 {
		userPriority = 50
	}
	return max(1, min(100, sharePriority*userPriority/100))
}

// CutDirection splits a share name into the name a policy gave it and the
// direction suffix the core added ("-download", "-upload" or ""): the
// reverse of SubShare.
func CutDirection(share string) (base, suffix string) {
	for _, suffix := range []string{"-download", "-upload"} {
		if base, ok := strings.CutSuffix(share, suffix); ok {
			return base, suffix
		}
	}
	return share, ""
}
