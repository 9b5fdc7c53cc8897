package csi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/uuid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
	"github.com/peregrine-storage/peregrine/pkg/mgmtpb"
)

// nameProp is the container property holding the CSI volume name a container was made for;
// containers without it are not volumes of this driver (ListVolumes skips them).
const nameProp = "user.csi.peregrine.dev/name"

// Volume context keys the controller hands the node (besides the mount options).
const (
	ctxPool = "pool"
	ctxCont = "container"
)

// ControllerServer is the CSI controller service: volumes are POSIX containers, their size a
// container quota, snapshots container snapshots.
type ControllerServer struct {
	csipb.UnimplementedControllerServer
	ms          mgmtpb.MgmtClient
	defaultPool string

	mu   sync.Mutex
	busy map[string]bool // names and IDs with an operation in flight
}

var _ EphemeralProvisioner = (*ControllerServer)(nil)

// lock serializes operations on one name; a second one meanwhile gets Aborted (the CO
// retries), as the CSI spec asks.
func (c *ControllerServer) lock(key string) (func(), error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.busy == nil {
		c.busy = map[string]bool{}
	}
	if c.busy[key] {
		return nil, status.Errorf(codes.Aborted, "an operation on %q is in progress", key)
	}
	c.busy[key] = true
	return func() {
		c.mu.Lock()
		delete(c.busy, key)
		c.mu.Unlock()
	}, nil
}

var labelOK = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,127}$`)

// containerLabel is the label of the container for volume `name`: the name itself when it is a
// valid label (PVs are "pvc-<uuid>"), else a digest of it.
func containerLabel(name string) string {
	if labelOK.MatchString(name) {
		if _, err := uuid.Parse(name); err != nil {
			return name
		}
	}
	sum := sha256.Sum256([]byte(name))
	return "csi-" + hex.EncodeToString(sum[:16])
}

// storeStatus turns a management service error into the CSI code for it, naming what was
// attempted.
func storeStatus(err error, format string, args ...any) error {
	st := status.Convert(err)
	code := st.Code()
	switch code {
	case codes.NotFound, codes.InvalidArgument, codes.ResourceExhausted, codes.AlreadyExists,
		codes.FailedPrecondition, codes.Aborted, codes.DeadlineExceeded, codes.Canceled, codes.PermissionDenied:
	case codes.Unavailable:
	default:
		code = codes.Internal
	}
	return status.Errorf(code, "%s: %s", fmt.Sprintf(format, args...), st.Message())
}

func checkCapabilities(caps []*csipb.VolumeCapability) error {
	if len(caps) == 0 {
		return status.Error(codes.InvalidArgument, "volume capabilities missing")
	}
	for _, c := range caps {
		if err := checkCapability(c); err != nil {
			return err
		}
	}
	return nil
}

// quotaOf turns a capacity range into the container quota (0: none asked).
func quotaOf(r *csipb.CapacityRange) (uint64, error) {
	if r == nil {
		return 0, nil
	}
	if r.RequiredBytes < 0 || r.LimitBytes < 0 {
		return 0, status.Error(codes.InvalidArgument, "capacity range: negative bytes")
	}
	if r.LimitBytes > 0 && r.RequiredBytes > r.LimitBytes {
		return 0, status.Errorf(codes.OutOfRange, "capacity range: required %d bytes above the limit %d", r.RequiredBytes, r.LimitBytes)
	}
	if r.RequiredBytes > 0 {
		return uint64(r.RequiredBytes), nil
	}
	return uint64(r.LimitBytes), nil
}

func fitsRange(quota uint64, r *csipb.CapacityRange) bool {
	if r == nil {
		return true
	}
	if r.RequiredBytes > 0 && (quota == 0 || quota < uint64(r.RequiredBytes)) {
		return false
	}
	return r.LimitBytes == 0 || (quota != 0 && quota <= uint64(r.LimitBytes))
}

func (c *ControllerServer) volume(info *mgmtpb.ContInfo, pool *mgmtpb.PoolInfo, mount map[string]string) *csipb.Volume {
	vctx := map[string]string{ctxPool: pool.Label, ctxCont: info.Label}
	for k, v := range mount {
		vctx[k] = v
	}
	return &csipb.Volume{
		VolumeId:      VolumeID{Pool: pool.Uuid, Cont: info.Uuid}.String(),
		CapacityBytes: int64(info.QuotaBytes),
		VolumeContext: vctx,
	}
}

func (c *ControllerServer) CreateVolume(ctx context.Context, req *csipb.CreateVolumeRequest) (*csipb.CreateVolumeResponse, error) {
	if req.Name == "" {
		return nil, status.Error(codes.InvalidArgument, "volume name missing")
	}
	if err := checkCapabilities(req.VolumeCapabilities); err != nil {
		return nil, err
	}
	params, err := ParseParams(req.Parameters, c.defaultPool)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	quota, err := quotaOf(req.CapacityRange)
	if err != nil {
		return nil, err
	}
	unlock, err := c.lock(req.Name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	vol, err := c.createVolume(ctx, req.Name, params, pvcRequester(req.Parameters), quota, req.CapacityRange, req.VolumeContentSource)
	if err != nil {
		return nil, err
	}
	vol.ContentSource = req.VolumeContentSource
	return &csipb.CreateVolumeResponse{Volume: vol}, nil
}

// createVolume makes (or finds, by name) the container of volume `name` in the pool of params
// for who; the pool's allowed namespaces (and a clone source's) must admit who.
func (c *ControllerServer) createVolume(ctx context.Context, name string, params *VolumeParams, who requester, quota uint64,
	rng *csipb.CapacityRange, src *csipb.VolumeContentSource) (*csipb.Volume, error) {
	pool, err := c.ms.PoolQuery(ctx, &mgmtpb.PoolQueryReq{Id: params.Pool})
	if err != nil {
		return nil, storeStatus(err, "pool %q (StorageClass parameter %s)", params.Pool, ParamPool)
	}
	if err := checkAllowed(pool.Props, fmt.Sprintf("pool %q", pool.Label), who); err != nil {
		return nil, status.Errorf(status.Code(err), "volume %q: %s", name, status.Convert(err).Message())
	}
	label := containerLabel(name)
	if have, err := c.ms.ContQuery(ctx, &mgmtpb.ContQueryReq{Pool: pool.Uuid, Id: label}); err == nil {
		switch {
		case have.State == mgmtpb.ContState_CONT_COPY_FAILED:
			// A clone cut short by a restart of the service: start it again.
			if _, err := c.ms.ContDestroy(ctx, &mgmtpb.ContDestroyReq{Pool: pool.Uuid, Id: have.Uuid}); err != nil {
				return nil, storeStatus(err, "remove the unfinished clone %q", label)
			}
		case have.State == mgmtpb.ContState_CONT_COPYING:
			return nil, status.Errorf(codes.Aborted, "volume %q: its content is still being copied", name)
		case have.Props[nameProp] != name:
			return nil, status.Errorf(codes.AlreadyExists, "volume %q: container %q of pool %q exists and was not made for it", name, label, pool.Label)
		default:
			if d := params.Matches(have); d != "" {
				return nil, status.Errorf(codes.AlreadyExists, "volume %q exists with other parameters: %s", name, d)
			}
			if !fitsRange(have.QuotaBytes, rng) {
				return nil, status.Errorf(codes.AlreadyExists, "volume %q exists with a size of %d bytes, outside the range asked", name, have.QuotaBytes)
			}
			if v := src.GetVolume(); v != nil {
				// Its copy ended after the call that started it gave up.
				if id, err := ParseVolumeID(v.VolumeId); err == nil {
					c.dropCloneSnapshot(ctx, pool.Uuid, &mgmtpb.ContCreateReq{CloneFrom: id.Cont, Label: label})
				}
			}
			return c.volume(have, pool, params.Mount), nil
		}
	} else if status.Code(err) != codes.NotFound {
		return nil, storeStatus(err, "volume %q", name)
	}
	if free := dataFree(pool, params.Oclass); quota > 0 && quota > free {
		return nil, status.Errorf(codes.ResourceExhausted, "pool %q: %d bytes asked, %d free for object class %s", pool.Label, quota, free, orDefault(params.Oclass, "SX"))
	}
	creq := params.ContCreateReq(label, quota)
	creq.Props[nameProp] = name
	if err := c.fillSource(ctx, creq, pool, who, src); err != nil {
		return nil, err
	}
	info, err := c.ms.ContCreate(ctx, creq)
	// The snapshot a copy from a volume reads stays until the copy ends: a call that timed
	// out leaves the copy running (the CO asks again and finds it copying, then ready).
	if code := status.Code(err); creq.CloneFrom != "" && src.GetVolume() != nil && code != codes.DeadlineExceeded && code != codes.Canceled {
		c.dropCloneSnapshot(ctx, pool.Uuid, creq)
	}
	if err != nil {
		return nil, storeStatus(err, "create container %q in pool %q for volume %q", label, pool.Label, name)
	}
	return c.volume(info, pool, params.Mount), nil
}

func orDefault(v, d string) string {
	if v == "" {
		return d
	}
	return v
}

// dataFree is what a pool can still take of data of an object class (replicas and parity out).
func dataFree(p *mgmtpb.PoolInfo, oclass string) uint64 {
	var free uint64
	for _, t := range p.Tiers {
		if t.Name == "nvme" {
			free = t.Free
		}
	}
	stored, data := storedPerData(oclass)
	return free / stored * data
}

// storedPerData is the bytes stored per byte of data of an object class: (stored, data).
func storedPerData(oclass string) (uint64, uint64) {
	switch {
	case strings.HasPrefix(oclass, "RP_"):
		n, _ := strconv.ParseUint(oclass[3:4], 10, 64)
		return max(n, 1), 1
	case strings.HasPrefix(oclass, "EC_"):
		var d, p uint64
		if _, err := fmt.Sscanf(oclass, "EC_%dP%dG", &d, &p); err == nil && d > 0 {
			return d + p, d
		}
	}
	return 1, 1
}

// cloneSnapPrefix names the snapshot a volume-to-volume clone takes of its source.
const cloneSnapPrefix = "csi-clone-source-"

// fillSource makes creq a clone of a snapshot or of a volume (through a snapshot of it taken now
// and dropped after the copy); the source container's allowed namespaces must admit who.
func (c *ControllerServer) fillSource(ctx context.Context, creq *mgmtpb.ContCreateReq, pool *mgmtpb.PoolInfo, who requester, src *csipb.VolumeContentSource) error {
	switch {
	case src == nil:
		return nil
	case src.GetSnapshot() != nil:
		id := src.GetSnapshot().SnapshotId
		s, err := ParseSnapshotID(id)
		if err != nil {
			return status.Errorf(codes.NotFound, "source snapshot: %v", err)
		}
		if _, err := c.findSnapshot(ctx, s); err != nil {
			return err
		}
		if s.Pool != pool.Uuid && s.Pool != pool.Label {
			return status.Errorf(codes.InvalidArgument, "source snapshot %q is in another pool than %q: clones stay in their pool", id, pool.Label)
		}
		if err := c.checkSource(ctx, pool, s.Cont, who, "source snapshot "+strconv.Quote(id)); err != nil {
			return err
		}
		creq.CloneFrom, creq.CloneEpoch = s.Cont, s.Epoch
	case src.GetVolume() != nil:
		id := src.GetVolume().VolumeId
		v, err := ParseVolumeID(id)
		if err != nil {
			return status.Errorf(codes.NotFound, "source volume: %v", err)
		}
		if v.Pool != pool.Uuid && v.Pool != pool.Label {
			return status.Errorf(codes.InvalidArgument, "source volume %q is in another pool than %q: clones stay in their pool", id, pool.Label)
		}
		if err := c.checkSource(ctx, pool, v.Cont, who, "source volume "+strconv.Quote(id)); err != nil {
			return err
		}
		snap, err := c.ms.SnapCreate(ctx, &mgmtpb.SnapCreateReq{Pool: v.Pool, Cont: v.Cont, Name: cloneSnapPrefix + creq.Label})
		if status.Code(err) == codes.AlreadyExists {
			// Left by an attempt that stopped half-way: start from a fresh one.
			c.dropCloneSnapshot(ctx, v.Pool, &mgmtpb.ContCreateReq{CloneFrom: v.Cont, Label: creq.Label})
			snap, err = c.ms.SnapCreate(ctx, &mgmtpb.SnapCreateReq{Pool: v.Pool, Cont: v.Cont, Name: cloneSnapPrefix + creq.Label})
		}
		if err != nil {
			return storeStatus(err, "source volume %q", id)
		}
		creq.CloneFrom, creq.CloneEpoch = v.Cont, snap.Epoch
	}
	return nil
}

// checkSource checks who against the allowed namespaces of a clone's source container: a copy
// must not hand its data to a namespace the source refuses.
func (c *ControllerServer) checkSource(ctx context.Context, pool *mgmtpb.PoolInfo, cont string, who requester, what string) error {
	info, err := c.ms.ContQuery(ctx, &mgmtpb.ContQueryReq{Pool: pool.Uuid, Id: cont})
	if err != nil {
		return storeStatus(err, "%s", what)
	}
	if err := checkAllowed(info.Props, fmt.Sprintf("container %q of pool %q", info.Label, pool.Label), who); err != nil {
		return status.Errorf(status.Code(err), "%s: %s", what, status.Convert(err).Message())
	}
	return nil
}

func (c *ControllerServer) dropCloneSnapshot(ctx context.Context, pool string, creq *mgmtpb.ContCreateReq) {
	_, _ = c.ms.SnapDestroy(ctx, &mgmtpb.SnapDestroyReq{Pool: pool, Cont: creq.CloneFrom, Name: cloneSnapPrefix + creq.Label})
}

// lookup finds a volume's container; NotFound when the ID is malformed or names nothing.
func (c *ControllerServer) lookup(ctx context.Context, id string) (*mgmtpb.ContInfo, *mgmtpb.PoolInfo, error) {
	v, err := ParseVolumeID(id)
	if err != nil {
		return nil, nil, status.Error(codes.NotFound, err.Error())
	}
	pool, err := c.ms.PoolQuery(ctx, &mgmtpb.PoolQueryReq{Id: v.Pool})
	if err != nil {
		return nil, nil, storeStatus(err, "volume %q", id)
	}
	info, err := c.ms.ContQuery(ctx, &mgmtpb.ContQueryReq{Pool: pool.Uuid, Id: v.Cont})
	if err != nil {
		return nil, nil, storeStatus(err, "volume %q", id)
	}
	return info, pool, nil
}

func (c *ControllerServer) DeleteVolume(ctx context.Context, req *csipb.DeleteVolumeRequest) (*csipb.DeleteVolumeResponse, error) {
	if req.VolumeId == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID missing")
	}
	unlock, err := c.lock(req.VolumeId)
	if err != nil {
		return nil, err
	}
	defer unlock()
	info, pool, err := c.lookup(ctx, req.VolumeId)
	if status.Code(err) == codes.NotFound {
		return &csipb.DeleteVolumeResponse{}, nil
	}
	if err != nil {
		return nil, err
	}
	// Snapshots live inside the container: deleting it would delete them too.
	snaps, err := c.ms.SnapList(ctx, &mgmtpb.SnapListReq{Pool: pool.Uuid, Cont: info.Uuid})
	if err != nil {
		return nil, storeStatus(err, "volume %q: snapshots", req.VolumeId)
	}
	if n := len(snaps.Snapshots); n > 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %q has %d snapshots: delete them first", req.VolumeId, n)
	}
	if _, err := c.ms.ContDestroy(ctx, &mgmtpb.ContDestroyReq{Pool: pool.Uuid, Id: info.Uuid}); err != nil && status.Code(err) != codes.NotFound {
		return nil, storeStatus(err, "delete volume %q", req.VolumeId)
	}
	return &csipb.DeleteVolumeResponse{}, nil
}

func (c *ControllerServer) ValidateVolumeCapabilities(ctx context.Context, req *csipb.ValidateVolumeCapabilitiesRequest) (*csipb.ValidateVolumeCapabilitiesResponse, error) {
	if req.VolumeId == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID missing")
	}
	if len(req.VolumeCapabilities) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume capabilities missing")
	}
	if _, _, err := c.lookup(ctx, req.VolumeId); err != nil {
		return nil, err
	}
	if err := checkCapabilities(req.VolumeCapabilities); err != nil {
		return &csipb.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
	}
	return &csipb.ValidateVolumeCapabilitiesResponse{Confirmed: &csipb.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.VolumeContext,
		VolumeCapabilities: req.VolumeCapabilities,
		Parameters:         req.Parameters,
	}}, nil
}

// page cuts a sorted list by a CSI starting token (an index) and max_entries.
func page(n int, token string, maxEntries int32) (int, int, string, error) {
	if maxEntries < 0 {
		return 0, 0, "", status.Error(codes.InvalidArgument, "max_entries is negative")
	}
	start := 0
	if token != "" {
		s, err := strconv.Atoi(token)
		if err != nil || s < 0 || s > n {
			return 0, 0, "", status.Errorf(codes.Aborted, "starting token %q: not one this driver gave", token)
		}
		start = s
	}
	end := n
	if maxEntries > 0 && start+int(maxEntries) < n {
		end = start + int(maxEntries)
	}
	next := ""
	if end < n {
		next = strconv.Itoa(end)
	}
	return start, end, next, nil
}

// volumes lists the containers of every pool made for CSI volumes, by volume ID.
func (c *ControllerServer) volumes(ctx context.Context) ([]*csipb.Volume, error) {
	pools, err := c.ms.PoolList(ctx, &mgmtpb.PoolListReq{})
	if err != nil {
		return nil, storeStatus(err, "list pools")
	}
	var out []*csipb.Volume
	for _, p := range pools.Pools {
		conts, err := c.ms.ContList(ctx, &mgmtpb.ContListReq{Pool: p.Uuid})
		if err != nil {
			return nil, storeStatus(err, "list containers of pool %q", p.Label)
		}
		for _, ci := range conts.Containers {
			if _, ok := ci.Props[nameProp]; ok && ci.State == mgmtpb.ContState_CONT_READY {
				out = append(out, c.volume(ci, p, nil))
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].VolumeId < out[j].VolumeId })
	return out, nil
}

func (c *ControllerServer) ListVolumes(ctx context.Context, req *csipb.ListVolumesRequest) (*csipb.ListVolumesResponse, error) {
	vols, err := c.volumes(ctx)
	if err != nil {
		return nil, err
	}
	start, end, next, err := page(len(vols), req.StartingToken, req.MaxEntries)
	if err != nil {
		return nil, err
	}
	resp := &csipb.ListVolumesResponse{NextToken: next}
	for _, v := range vols[start:end] {
		resp.Entries = append(resp.Entries, &csipb.ListVolumesResponse_Entry{Volume: v})
	}
	return resp, nil
}

func (c *ControllerServer) ControllerGetVolume(ctx context.Context, req *csipb.ControllerGetVolumeRequest) (*csipb.ControllerGetVolumeResponse, error) {
	if req.VolumeId == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID missing")
	}
	info, pool, err := c.lookup(ctx, req.VolumeId)
	if err != nil {
		return nil, err
	}
	cond := &csipb.VolumeCondition{Message: "pool " + pool.Label + " is " + pool.State.Word()}
	if pool.State == mgmtpb.PoolState_POOL_STATE_DEGRADED {
		cond.Abnormal = true
		cond.Message = fmt.Sprintf("pool %s is degraded: %d of %d targets are out; data of objects without redundancy on them cannot be reached",
			pool.Label, pool.DisabledTargets, pool.TotalTargets)
	}
	return &csipb.ControllerGetVolumeResponse{
		Volume: c.volume(info, pool, nil),
		Status: &csipb.ControllerGetVolumeResponse_VolumeStatus{VolumeCondition: cond},
	}, nil
}

func (c *ControllerServer) GetCapacity(ctx context.Context, req *csipb.GetCapacityRequest) (*csipb.GetCapacityResponse, error) {
	for _, cap := range req.VolumeCapabilities {
		if err := checkCapability(cap); err != nil {
			return &csipb.GetCapacityResponse{}, nil
		}
	}
	var pools []*mgmtpb.PoolInfo
	oclass := ""
	if len(req.Parameters) > 0 || c.defaultPool != "" {
		params, err := ParseParams(req.Parameters, c.defaultPool)
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		oclass = params.Oclass
		p, err := c.ms.PoolQuery(ctx, &mgmtpb.PoolQueryReq{Id: params.Pool})
		if err != nil {
			return nil, storeStatus(err, "pool %q", params.Pool)
		}
		pools = append(pools, p)
	} else {
		all, err := c.ms.PoolList(ctx, &mgmtpb.PoolListReq{})
		if err != nil {
			return nil, storeStatus(err, "list pools")
		}
		pools = all.Pools
	}
	var free uint64
	for _, p := range pools {
		free += dataFree(p, oclass)
	}
	return &csipb.GetCapacityResponse{AvailableCapacity: int64(min(free, 1<<62))}, nil
}

func (c *ControllerServer) ControllerGetCapabilities(context.Context, *csipb.ControllerGetCapabilitiesRequest) (*csipb.ControllerGetCapabilitiesResponse, error) {
	var caps []*csipb.ControllerServiceCapability
	for _, t := range []csipb.ControllerServiceCapability_RPC_Type{
		csipb.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csipb.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csipb.ControllerServiceCapability_RPC_GET_CAPACITY,
		csipb.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
		csipb.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
		csipb.ControllerServiceCapability_RPC_CLONE_VOLUME,
		csipb.ControllerServiceCapability_RPC_EXPAND_VOLUME,
		csipb.ControllerServiceCapability_RPC_GET_VOLUME,
		csipb.ControllerServiceCapability_RPC_VOLUME_CONDITION,
		csipb.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
	} {
		caps = append(caps, &csipb.ControllerServiceCapability{Type: &csipb.ControllerServiceCapability_Rpc{
			Rpc: &csipb.ControllerServiceCapability_RPC{Type: t}}})
	}
	return &csipb.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

// ControllerExpandVolume raises the container's quota; the mount sees it at once (statfs asks
// the store), so no node step is needed.
func (c *ControllerServer) ControllerExpandVolume(ctx context.Context, req *csipb.ControllerExpandVolumeRequest) (*csipb.ControllerExpandVolumeResponse, error) {
	if req.VolumeId == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID missing")
	}
	if req.CapacityRange == nil {
		return nil, status.Error(codes.InvalidArgument, "capacity range missing")
	}
	want, err := quotaOf(req.CapacityRange)
	if err != nil {
		return nil, err
	}
	unlock, err := c.lock(req.VolumeId)
	if err != nil {
		return nil, err
	}
	defer unlock()
	info, pool, err := c.lookup(ctx, req.VolumeId)
	if err != nil {
		return nil, err
	}
	size := info.QuotaBytes
	if want > size || (size == 0 && want > 0) {
		if _, err := c.ms.ContSetProp(ctx, &mgmtpb.ContSetPropReq{Pool: pool.Uuid, Id: info.Uuid,
			Props: map[string]string{"quota": strconv.FormatUint(want, 10)}}); err != nil {
			return nil, storeStatus(err, "expand volume %q", req.VolumeId)
		}
		size = want
	}
	return &csipb.ControllerExpandVolumeResponse{CapacityBytes: int64(size)}, nil
}

// CreateEphemeral makes the container of an inline ephemeral volume from the pod's volume
// attributes: the StorageClass parameters, and `size` for its quota.
func (c *ControllerServer) CreateEphemeral(ctx context.Context, name string, attrs map[string]string) (VolumeID, error) {
	p := map[string]string{}
	var quota uint64
	for k, v := range attrs {
		if k == "size" {
			q, err := storagev1.Size(v).Bytes()
			if err != nil {
				return VolumeID{}, status.Errorf(codes.InvalidArgument, "volume attribute size=%q: %v", v, err)
			}
			quota = q
			continue
		}
		p[k] = v
	}
	params, err := ParseParams(p, c.defaultPool)
	if err != nil {
		return VolumeID{}, status.Error(codes.InvalidArgument, err.Error())
	}
	// The pod's namespace and service account are in its volume attributes (podInfoOnMount).
	vol, err := c.createVolume(ctx, name, params, podRequester(attrs), quota, nil, nil)
	if err != nil {
		return VolumeID{}, err
	}
	return ParseVolumeID(vol.VolumeId)
}

// DeleteEphemeral destroys an inline volume's container.
func (c *ControllerServer) DeleteEphemeral(ctx context.Context, id VolumeID) error {
	_, err := c.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: id.String()})
	return err
}
