! rtpool_grpc: the GridRPC C API of librtpool for Fortran, through ISO_C_BINDING.
! Fortran cannot call C varargs: calls go through rtpool_call_argv, an array of c_loc()
! pointers in the interface's order (int parameters as integer(c_int64_t), floats as
! real(c_double), arrays by their first element). Fortran arrays are column major and the
! served functions see C (row major) order: a Fortran matrix arrives transposed, so
! dmmul(n, B, A, C) computes C = A B in Fortran terms (docs/clients.md, "Fortran").
module rtpool_grpc
  use iso_c_binding
  implicit none
  integer(c_int), parameter :: GRPC_NO_ERROR = 0

  type, bind(c) :: grpc_function_handle_t
    integer(c_int64_t) :: id = 0
  end type

  interface
    integer(c_int) function grpc_initialize(config_file) bind(c, name="grpc_initialize")
      import :: c_int, c_ptr
      type(c_ptr), value :: config_file
    end function
    integer(c_int) function grpc_finalize() bind(c, name="grpc_finalize")
      import :: c_int
    end function
    integer(c_int) function grpc_function_handle_default(handle, func_name) &
        bind(c, name="grpc_function_handle_default")
      import :: c_int, c_char, grpc_function_handle_t
      type(grpc_function_handle_t), intent(inout) :: handle
      character(kind=c_char), dimension(*), intent(in) :: func_name
    end function
    integer(c_int) function grpc_function_handle_destruct(handle) &
        bind(c, name="grpc_function_handle_destruct")
      import :: c_int, grpc_function_handle_t
      type(grpc_function_handle_t), intent(inout) :: handle
    end function
    integer(c_int) function rtpool_call_argv(handle, argv, argc) bind(c, name="rtpool_call_argv")
      import :: c_int, c_ptr, c_size_t, grpc_function_handle_t
      type(grpc_function_handle_t), intent(inout) :: handle
      type(c_ptr), dimension(*), intent(in) :: argv
      integer(c_size_t), value :: argc
    end function
    type(c_ptr) function rtpool_last_error_message_c() bind(c, name="rtpool_last_error_message")
      import :: c_ptr
    end function
    integer(c_size_t) function c_strlen(s) bind(c, name="strlen")
      import :: c_ptr, c_size_t
      type(c_ptr), value :: s
    end function
  end interface

contains

  ! The message of this thread's last GridRPC call, as a Fortran string.
  function rtpool_last_error_message() result(msg)
    character(len=:), allocatable :: msg
    type(c_ptr) :: p
    character(kind=c_char), pointer :: chars(:)
    integer :: i, n
    p = rtpool_last_error_message_c()
    n = int(c_strlen(p))
    call c_f_pointer(p, chars, [n])
    allocate(character(len=n) :: msg)
    do i = 1, n
      msg(i:i) = chars(i)
    end do
  end function

  ! Stops the program with the code and message of a failed call.
  subroutine grpc_check(err, what)
    integer(c_int), intent(in) :: err
    character(len=*), intent(in) :: what
    if (err /= GRPC_NO_ERROR) then
      write (*, '(a, ": error ", i0, ": ", a)') what, err, rtpool_last_error_message()
      error stop 3
    end if
  end subroutine
end module
