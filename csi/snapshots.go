package csi

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/peregrine-storage/peregrine/pkg/mgmtpb"
)

// SnapshotID names a container snapshot: "POOL/CONT/EPOCH".
type SnapshotID struct {
	Pool, Cont string
	Epoch      uint64
}

func (s SnapshotID) String() string { return fmt.Sprintf("%s/%s/%d", s.Pool, s.Cont, s.Epoch) }

// Volume is the volume the snapshot was taken of.
func (s SnapshotID) Volume() VolumeID { return VolumeID{Pool: s.Pool, Cont: s.Cont} }

// ParseSnapshotID parses "POOL/CONT/EPOCH".
func ParseSnapshotID(id string) (SnapshotID, error) {
	parts := strings.Split(id, "/")
	if len(parts) == 3 && parts[0] != "" && parts[1] != "" {
		if e, err := strconv.ParseUint(parts[2], 10, 64); err == nil && e > 0 {
			return SnapshotID{Pool: parts[0], Cont: parts[1], Epoch: e}, nil
		}
	}
	return SnapshotID{}, fmt.Errorf("snapshot ID %q: want POOL/CONT/EPOCH", id)
}

// snapshotName is the store's name of the snapshot made for CSI snapshot `name`.
func snapshotName(name string) string { return "csi:" + containerLabel(name) }

func csiSnapshot(id SnapshotID, s *mgmtpb.Snapshot, size uint64) *csipb.Snapshot {
	return &csipb.Snapshot{
		SnapshotId:     id.String(),
		SourceVolumeId: id.Volume().String(),
		SizeBytes:      int64(size),
		CreationTime:   timestamppb.New(timeOf(s.CreatedUnix)),
		ReadyToUse:     true,
	}
}

// snapshots lists every CSI snapshot (named by this driver) of every volume, by ID.
func (c *ControllerServer) snapshots(ctx context.Context) ([]*csipb.Snapshot, map[string]*csipb.Snapshot, error) {
	vols, err := c.volumes(ctx)
	if err != nil {
		return nil, nil, err
	}
	var out []*csipb.Snapshot
	byName := map[string]*csipb.Snapshot{}
	for _, v := range vols {
		id, _ := ParseVolumeID(v.VolumeId)
		list, err := c.ms.SnapList(ctx, &mgmtpb.SnapListReq{Pool: id.Pool, Cont: id.Cont})
		if status.Code(err) == codes.NotFound {
			continue
		}
		if err != nil {
			return nil, nil, storeStatus(err, "snapshots of volume %q", v.VolumeId)
		}
		for _, s := range list.Snapshots {
			if !strings.HasPrefix(s.Name, "csi:") {
				continue
			}
			cs := csiSnapshot(SnapshotID{Pool: id.Pool, Cont: id.Cont, Epoch: s.Epoch}, s, uint64(v.CapacityBytes))
			out = append(out, cs)
			byName[s.Name] = cs
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SnapshotId < out[j].SnapshotId })
	return out, byName, nil
}

// findSnapshot returns the store's snapshot of an ID; NotFound when there is none.
func (c *ControllerServer) findSnapshot(ctx context.Context, id SnapshotID) (*mgmtpb.Snapshot, error) {
	list, err := c.ms.SnapList(ctx, &mgmtpb.SnapListReq{Pool: id.Pool, Cont: id.Cont})
	if err != nil {
		return nil, storeStatus(err, "snapshot %q", id)
	}
	for _, s := range list.Snapshots {
		if s.Epoch == id.Epoch {
			return s, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "snapshot %q: no such snapshot", id)
}

func (c *ControllerServer) CreateSnapshot(ctx context.Context, req *csipb.CreateSnapshotRequest) (*csipb.CreateSnapshotResponse, error) {
	if req.Name == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot name missing")
	}
	if req.SourceVolumeId == "" {
		return nil, status.Error(codes.InvalidArgument, "source volume ID missing")
	}
	unlock, err := c.lock("snapshot/" + req.Name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	_, byName, err := c.snapshots(ctx)
	if err != nil {
		return nil, err
	}
	name := snapshotName(req.Name)
	if s, ok := byName[name]; ok {
		if s.SourceVolumeId != req.SourceVolumeId {
			return nil, status.Errorf(codes.AlreadyExists, "snapshot %q exists, of volume %q", req.Name, s.SourceVolumeId)
		}
		return &csipb.CreateSnapshotResponse{Snapshot: s}, nil
	}
	info, pool, err := c.lookup(ctx, req.SourceVolumeId)
	if err != nil {
		return nil, err
	}
	s, err := c.ms.SnapCreate(ctx, &mgmtpb.SnapCreateReq{Pool: pool.Uuid, Cont: info.Uuid, Name: name})
	if err != nil {
		return nil, storeStatus(err, "snapshot %q of volume %q", req.Name, req.SourceVolumeId)
	}
	id := SnapshotID{Pool: pool.Uuid, Cont: info.Uuid, Epoch: s.Epoch}
	return &csipb.CreateSnapshotResponse{Snapshot: csiSnapshot(id, s, info.QuotaBytes)}, nil
}

func (c *ControllerServer) DeleteSnapshot(ctx context.Context, req *csipb.DeleteSnapshotRequest) (*csipb.DeleteSnapshotResponse, error) {
	if req.SnapshotId == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot ID missing")
	}
	id, err := ParseSnapshotID(req.SnapshotId)
	if err != nil {
		return &csipb.DeleteSnapshotResponse{}, nil // names nothing: nothing to delete
	}
	_, err = c.ms.SnapDestroy(ctx, &mgmtpb.SnapDestroyReq{Pool: id.Pool, Cont: id.Cont, Epoch: id.Epoch})
	if err != nil && status.Code(err) != codes.NotFound {
		return nil, storeStatus(err, "delete snapshot %q", req.SnapshotId)
	}
	return &csipb.DeleteSnapshotResponse{}, nil
}

func (c *ControllerServer) ListSnapshots(ctx context.Context, req *csipb.ListSnapshotsRequest) (*csipb.ListSnapshotsResponse, error) {
	all, _, err := c.snapshots(ctx)
	if err != nil {
		return nil, err
	}
	var list []*csipb.Snapshot
	for _, s := range all {
		if (req.SnapshotId == "" || s.SnapshotId == req.SnapshotId) &&
			(req.SourceVolumeId == "" || s.SourceVolumeId == req.SourceVolumeId) {
			list = append(list, s)
		}
	}
	start, end, next, err := page(len(list), req.StartingToken, req.MaxEntries)
	if err != nil {
		return nil, err
	}
	resp := &csipb.ListSnapshotsResponse{NextToken: next}
	for _, s := range list[start:end] {
		resp.Entries = append(resp.Entries, &csipb.ListSnapshotsResponse_Entry{Snapshot: s})
	}
	return resp, nil
}

func timeOf(unix uint64) time.Time { return time.Unix(int64(unix), 0) }
